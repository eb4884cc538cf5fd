-- Argo CD health of a Bundle (automanager.norsk.video/v1alpha1).
-- Healthy when every job runs with its resilience (or a scheduled bundle waits for its start,
-- or has ended); Degraded when it is broken, refused
-- (Stalled) or runs without the resilience it asked for; Progressing while placing or starting.

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

-- kstatus: Stalled means no progress without a change to the resource.
if holds("Stalled") then
  hs.status = "Degraded"
  hs.message = condition("Stalled").message
  return hs
end

if holds("Broken") then
  hs.status = "Degraded"
  hs.message = condition("Broken").message
  return hs
end
if ready.status == "True" and holds("Degraded") then
  hs.status = "Degraded"
  hs.message = condition("Degraded").message
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
else
  hs.status = "Progressing"
end
hs.message = ready.message
return hs

