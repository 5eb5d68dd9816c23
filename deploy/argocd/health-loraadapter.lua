-- Argo CD health check for lorapool.io/LoRAAdapter (argocd-cm key:
-- resource.customizations.health.lorapool.io_LoRAAdapter). The pool's operator writes the
-- adapter's conditions: Degraded=True (invalid, unreadable, name conflict) needs a human.
local hs = {}
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator of pool " .. tostring(obj.spec and obj.spec.poolRef and obj.spec.poolRef.name) .. " to report status"
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the lorapool operator to observe generation " .. tostring(generation)
  return hs
end
local ready, degraded
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Ready" then
    ready = condition
  elseif condition.type == "Degraded" then
    degraded = condition
  end
end
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = (degraded.reason or "Degraded") .. ": " .. (degraded.message or "")
elseif ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
else
  hs.status = "Progressing"
  hs.message = (obj.status.phase or "Pending") .. ": " .. ((ready ~= nil and ready.message) or "waiting for the pool")
end
return hs
