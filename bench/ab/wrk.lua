-- A/B load script for chirp. Usage:
--   wrk -t1 -c32 -d15s --latency -s bench/ab/wrk.lua URL -- TOKENS_FILE METHOD PATH [post]
-- TOKENS_FILE: one bearer token per line (the 200 seeded users). One request per token is
-- prebuilt; each call of request() takes the next one, so the load rotates over all tokens.
-- With "post" the body is {"content": "..."} (Content-Type: application/json).
local requests = {}
local position = 1

function init(args)
  local file, method, path, post = args[1], args[2], args[3], args[4]
  local i = 0
  for token in io.lines(file) do
    if token ~= "" then
      i = i + 1
      local headers = { ["Authorization"] = "Bearer " .. token }
      local body = nil
      if post == "post" then
        headers["Content-Type"] = "application/json"
        body = string.format('{"content": "ab bench tweet from seeded user %d"}', i)
      end
      requests[#requests + 1] = wrk.format(method, path, headers, body)
    end
  end
  if #requests == 0 then error("no tokens in " .. file) end
  position = math.random(#requests)
end

function request()
  position = position % #requests + 1
  return requests[position]
end

function done(summary, latency, requests_)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d seconds=%.6f rps=%.3f connect=%d read=%d write=%d status=%d timeout=%d p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
