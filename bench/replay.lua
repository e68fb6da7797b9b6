-- wrk script: replays a prepared request file, one request per line:
--   METHOD <TAB> PATH <TAB> BEARER TOKEN (may be empty) <TAB> JSON BODY (may be empty)
-- Each wrk thread starts at a different offset and walks the file round robin, so requests
-- rotate over every account in the file. Usage: wrk ... -s bench/replay.lua -- FILE
local requests = {}
local position = 1

function init(args)
  local file = args[1]
  for line in io.lines(file) do
    local method, path, token, body = line:match("^([^\t]*)\t([^\t]*)\t([^\t]*)\t?(.*)$")
    if method then
      local headers = {}
      if token ~= "" then headers["Authorization"] = "Bearer " .. token end
      if body ~= "" then headers["Content-Type"] = "application/json" else body = nil end
      requests[#requests + 1] = wrk.format(method, path, headers, body)
    end
  end
  if #requests == 0 then error("no requests in " .. file) end
  position = math.random(#requests)
end

function request()
  position = position % #requests + 1
  return requests[position]
end

function done(summary, latency, requests_)
  local e = summary.errors
  local errors = e.connect + e.read + e.write + e.status + e.timeout
  io.write(string.format(
    "RESULT requests=%d seconds=%.3f rps=%.1f errors=%d p50=%.3f p75=%.3f p90=%.3f p99=%.3f p999=%.3f\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6), errors,
    latency:percentile(50) / 1000, latency:percentile(75) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency:percentile(99.9) / 1000))
end
