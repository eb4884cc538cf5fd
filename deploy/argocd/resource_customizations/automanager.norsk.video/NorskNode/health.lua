-- Argo CD health of a NorskNode (automanager.norsk.video/v1alpha1).
-- Healthy while running and healthy; Suspended while cordoned; Degraded when excluded from
-- placement as unhealthy; Progressing while starting, stopping or stopped.

local hs = {}

local function condition(type)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local function holds(type)
  local c = condition(type)
  return c ~= nil and c.status == "True"
end

-- The operator has not written this generation yet: what the status says is about an
-- older spec (status.observedGeneration, else the Ready condition's).
local function stale()
  local generation = obj.metadata.generation
  if generation == nil or obj.status == nil then
    return false
  end
  local observed = obj.status.observedGeneration
  local ready = condition("Ready")
  if observed == nil and ready ~= nil then
    observed = ready.observedGeneration
  end
  return observed ~= nil and observed < generation
end

local ready = condition("Ready")
if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end
if stale() then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. obj.metadata.generation
  return hs
end

if ready.status ~= "True" and ready.reason == "Unhealthy" then
  hs.status = "Degraded"
  hs.message = ready.message
  return hs
end
if holds("Cordoned") then
  hs.status = "Suspended"
  hs.message = "Cordoned: no new placement lands here"
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
else
  hs.status = "Progressing"
end
hs.message = ready.message
return hs

