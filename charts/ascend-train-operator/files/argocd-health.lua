-- Argo CD health check for AscendTrainJob, DatasetPrep and CheckpointConvert (docs/gitops.md shows where it goes:
-- argocd-cm's resource.customizations.health.ascendtrain.dev_<Kind>). It reads what kstatus reads, in Argo CD's
-- words: Healthy once Ready=True (the job Succeeded, the dataset or conversion done), Degraded with the cause once
-- Stalled=True (the job Failed), Suspended while the job is suspended or queued (Kueue), else Progressing.
-- Written for Argo CD's sandbox (no string library): base functions only.
local hs = {status = "Progressing", message = "Waiting for the operator to pick the job up"}
if obj.status == nil then
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end
local ready, stalled, suspended
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == "Ready" then
      ready = condition
    elseif condition.type == "Stalled" then
      stalled = condition
    elseif condition.type == "Suspended" then
      suspended = condition
    end
  end
end
if stalled ~= nil and stalled.status == "True" then
  return {status = "Degraded", message = stalled.message}
end
if ready ~= nil and ready.status == "True" then
  return {status = "Healthy", message = ready.message}
end
if suspended ~= nil and suspended.status == "True" then
  return {status = "Suspended", message = suspended.message}
end
if ready ~= nil and ready.message ~= nil and ready.message ~= "" then
  hs.message = ready.message
end
return hs
