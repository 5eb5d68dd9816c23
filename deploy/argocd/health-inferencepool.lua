-- Argo CD health check for inference.networking.k8s.io/InferencePool (argocd-cm key:
-- resource.customizations.health.inference.networking.k8s.io_InferencePool). Gateways write one
-- entry per parent (Gateway) in status.parents: Accepted=True and ResolvedRefs not False routes.
local hs = {}
local parents = obj.status and obj.status.parents
if parents == nil or #parents == 0 then
  hs.status = "Progressing"
  hs.message = "No Gateway reports this InferencePool yet: reference it from an HTTPRoute backendRef"
  return hs
end
local routed, refused = {}, {}
for _, parent in ipairs(parents) do
  local name = (parent.parentRef and parent.parentRef.name) or "?"
  local accepted, resolved
  for _, condition in ipairs(parent.conditions or {}) do
    if condition.type == "Accepted" then
      accepted = condition
    elseif condition.type == "ResolvedRefs" then
      resolved = condition
    end
  end
  if accepted ~= nil and accepted.status == "False" then
    table.insert(refused, name .. ": " .. (accepted.reason or "NotAccepted") .. " " .. (accepted.message or ""))
  elseif resolved ~= nil and resolved.status == "False" then
    table.insert(refused, name .. ": " .. (resolved.reason or "InvalidExtensionRef") .. " " .. (resolved.message or ""))
  elseif accepted ~= nil and accepted.status == "True" then
    table.insert(routed, name)
  end
end
if #refused > 0 then
  hs.status = "Degraded"
  hs.message = table.concat(refused, "; ")
elseif #routed > 0 then
  hs.status = "Healthy"
  hs.message = "Accepted by " .. table.concat(routed, ", ")
else
  hs.status = "Progressing"
  hs.message = "Waiting for a Gateway to accept this InferencePool"
end
return hs
