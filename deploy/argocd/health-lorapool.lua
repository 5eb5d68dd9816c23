-- Argo CD health check for lorapool.io/LoRAPool (argocd-cm key:
-- resource.customizations.health.lorapool.io_LoRAPool). Reads the kstatus-style conditions
-- the operator writes: Degraded=True needs a human, Ready=True serves, anything else converges.
local hs = {}
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the lorapool operator to report status"
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the lorapool operator to observe generation " .. tostring(generation)
  return hs
end
local ready, progressing, degraded
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Ready" then
    ready = condition
  elseif condition.type == "Progressing" then
    progressing = condition
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
elseif progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = (progressing.reason or "Progressing") .. ": " .. (progressing.message or "")
else
  hs.status = "Progressing"
  hs.message = (ready ~= nil and ready.message) or "Waiting for the pool to become Ready"
end
return hs
