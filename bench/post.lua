-- wrk script: POST the JSON body in the file named by $WEIR_BENCH_BODY, and print the
-- result as one JSON line (prefixed "WRK_JSON ") when the run is done. Latencies in µs.
local path = os.getenv("WEIR_BENCH_BODY")
local file = assert(io.open(path, "rb"), "cannot open body file " .. tostring(path))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/json"

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "bytes": %d, '
      .. '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, '
      .. '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "mean": %.1f, "max": %d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max
  ))
end
