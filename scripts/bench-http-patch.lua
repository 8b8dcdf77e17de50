-- wrk script of scripts/bench-http: PATCH /v1/tasks/{id}/state, run with one connection per
-- thread (`wrk -tN -cN`). Each thread owns one task: it sends a merge patch with `If-Match` =
-- the version it last saw and learns the next one from the answer's ETag, so every PATCH names
-- the current version of its own task (a 412 would mean a stale If-Match: the run fails).
-- The patch changes the item on one shelf of the warehouse state, so the state keeps its size.
--
-- With BENCH_RATE (requests per second, all threads together) each thread sends on a fixed
-- schedule (its share of the rate, the threads' schedules offset evenly) instead of as fast as
-- answers come back, and latency is counted from the moment the schedule said to send, so an
-- answer that came late also delays the requests due after it in the figures (wrk alone counts
-- from the actual send). The script prints these latencies itself; without BENCH_RATE they are
-- the plain ones.
--
-- Environment: BENCH_TASKS (a file of lines `<task id> <version>`, one per thread at least),
-- BENCH_KEY (the API key), BENCH_OUT (written at the end: one line per thread,
-- `<task id> <200s> <last version seen> <1 if a request was still in flight, else 0>`),
-- BENCH_RATE (optional).

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local clock = ffi.new("bench_timespec")
local CLOCK_MONOTONIC = 1
local function now_ms()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, clock)
  return tonumber(clock.tv_sec) * 1000 + tonumber(clock.tv_nsec) / 1e6
end

local tasks = {}
for line in io.lines(os.getenv("BENCH_TASKS")) do
  local id, version = line:match("^(%S+)%s+(%d+)")
  if id then tasks[#tasks + 1] = { id = id, version = tonumber(version) } end
end
local key = os.getenv("BENCH_KEY")
local rate = tonumber(os.getenv("BENCH_RATE") or "")

local threads = {}

function setup(thread)
  local task = tasks[#threads + 1]
  if task == nil then
    error("bench-http-patch.lua: more threads than tasks in BENCH_TASKS")
  end
  thread:set("task", task.id)
  thread:set("version", task.version)
  thread:set("index", #threads)
  table.insert(threads, thread)
end

-- Latencies in buckets of 0.1 ms (the last bucket holds everything from 10 s on).
local BUCKET_MS = 0.1
local BUCKETS = 100000

function init(args)
  path = "/v1/tasks/" .. task .. "/state"
  ok = 0
  not_ok = 0
  in_flight = 0
  statuses = ""
  counter = 0
  histogram = {}
  if rate then
    -- Each thread's share of the rate; thread i starts i/N of an interval late.
    interval = 1000 * #tasks / rate
    due = now_ms() + interval * index / #tasks
  end
end

function delay()
  if not rate then return 0 end
  local wait = due - now_ms()
  return wait > 0 and wait or 0
end

function request()
  counter = counter + 1
  in_flight = 1
  if rate then
    sent_at = due
    due = due + interval
  else
    sent_at = now_ms()
  end
  local body = string.format('{"inventory":{"shelf_7":"item_%d"}}', counter)
  return wrk.format("PATCH", path, {
    ["Authorization"] = "Bearer " .. key,
    ["Content-Type"] = "application/merge-patch+json",
    ["If-Match"] = '"' .. version .. '"',
  }, body)
end

function response(status, headers, body)
  in_flight = 0
  local bucket = math.min(math.floor((now_ms() - sent_at) / BUCKET_MS), BUCKETS - 1)
  histogram[bucket] = (histogram[bucket] or 0) + 1
  if status == 200 then
    ok = ok + 1
    local tag = headers["etag"] or headers["ETag"] or ""
    version = tonumber(tag:match('"(%d+)"')) or -1
  else
    not_ok = not_ok + 1
    if #statuses < 200 then statuses = statuses .. " " .. status end
  end
end

function done(summary, latency, requests)
  local out = assert(io.open(os.getenv("BENCH_OUT"), "w"))
  local total_ok, total_bad = 0, 0
  local counts, answered = {}, 0
  for _, thread in ipairs(threads) do
    out:write(string.format("%s %d %d %d\n", thread:get("task"), thread:get("ok"),
      thread:get("version"), thread:get("in_flight")))
    total_ok = total_ok + thread:get("ok")
    total_bad = total_bad + thread:get("not_ok")
    local seen = thread:get("statuses")
    if seen ~= "" then io.write("bench: task " .. thread:get("task") .. " answered" .. seen .. "\n") end
    for bucket, n in pairs(thread:get("histogram")) do
      counts[bucket] = (counts[bucket] or 0) + n
      answered = answered + n
    end
  end
  out:close()
  io.write(string.format("bench: PATCH answers 200: %d, other: %d\n", total_ok, total_bad))
  local buckets = {}
  for bucket in pairs(counts) do buckets[#buckets + 1] = bucket end
  table.sort(buckets)
  local function percentile(p)
    local want, seen = math.ceil(answered * p / 100), 0
    for _, bucket in ipairs(buckets) do
      seen = seen + counts[bucket]
      if seen >= want then return (bucket + 1) * BUCKET_MS end
    end
    return 0
  end
  local what = rate and string.format("from the scheduled send, %d/s offered", rate) or "from the send"
  io.write(string.format(
    "bench: PATCH latency %s: p50 %.1fms, p90 %.1fms, p99 %.1fms, p99.9 %.1fms (%d answers)\n",
    what, percentile(50), percentile(90), percentile(99), percentile(99.9), answered))
end
