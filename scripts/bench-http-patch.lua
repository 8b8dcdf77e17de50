-- wrk script of scripts/bench-http: PATCH /v1/tasks/{id}/state with as many tasks as
-- connections (`wrk -tT -cN`, N tasks). Each thread owns N/T tasks: a connection ready to send
-- takes a task of its thread that has no request in flight, sends a merge patch with
-- `If-Match` = the version last seen for that task, and the answer's ETag gives the next one,
-- so every PATCH names the current version of its task (a 412 would mean a stale If-Match: the
-- run fails). An answer is matched to its task by the patch's value, which is unique per
-- thread and comes back in the state the answer holds. The patch changes the item on one shelf
-- of the warehouse state, so the state keeps its size.
--
-- With BENCH_RATE (requests per second, all threads together) each thread sends on a fixed
-- schedule (its share of the rate, the threads' schedules offset evenly; each send takes the
-- next slot of its thread's schedule) instead of as fast as answers come back, and latency is
-- counted from the slot, so an answer that came late also delays the requests due after it in
-- the figures (wrk alone counts from the actual send). The script prints these latencies
-- itself; without BENCH_RATE they are the plain ones.
--
-- A problem answer (a 412, say) is matched by its `instance`, the state's path, and counted as
-- a failure; the task stays in use with the version it had.
--
-- Environment: BENCH_TASKS (a file of lines `<task id> <version>`, one per connection),
-- BENCH_KEY (the API key), BENCH_OUT (written at the end: one line per task,
-- `<task id> <200s> <last version seen> <1 if a request was still in flight, else 0>`),
-- BENCH_RATE (optional), BENCH_THREADS (wrk's -t).

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
local thread_count = tonumber(os.getenv("BENCH_THREADS") or "")
if not thread_count or #tasks % thread_count ~= 0 then
  error("bench-http-patch.lua: BENCH_THREADS must divide the number of tasks in BENCH_TASKS")
end

function setup(thread)
  -- Thread i owns the tasks i+1, i+1+T, i+1+2T, ... as "id version id version ...".
  local index = #threads
  local owned = {}
  for i = index + 1, #tasks, thread_count do
    owned[#owned + 1] = tasks[i].id .. " " .. tasks[i].version
  end
  thread:set("owned", table.concat(owned, " "))
  thread:set("index", index)
  table.insert(threads, thread)
end

-- Latencies in buckets of 0.1 ms (the last bucket holds everything from 10 s on).
local BUCKET_MS = 0.1
local BUCKETS = 100000

function init(args)
  -- This thread's tasks by number, in flat tables (wrk copies only flat ones to done()).
  ids, paths, versions, oks, flying, sent_at = {}, {}, {}, {}, {}, {}
  idle = {}
  by_path = {}
  for id, version in owned:gmatch("(%S+) (%d+)") do
    local n = #ids + 1
    ids[n], versions[n], oks[n], flying[n] = id, tonumber(version), 0, 0
    paths[n] = "/v1/tasks/" .. id .. "/state"
    idle[#idle + 1] = n
    by_path[paths[n]] = n
  end
  -- Requests in flight by the counter their patch carries.
  sent = {}
  not_ok = 0
  statuses = ""
  counter = 0
  histogram = {}
  slots = {}
  -- Sends wrk has arranged (it calls delay() before each send, and request() once more at the
  -- start only to check what it builds).
  armed = 0
  if rate then
    -- Each thread's share of the rate; thread i starts i/T of an interval late.
    interval = 1000 * thread_count / rate
    due = now_ms() + interval * index / thread_count
  end
end

function delay()
  armed = armed + 1
  if not rate then return 0 end
  -- Each send takes the next slot of the schedule, in the order the sends are arranged.
  local slot = due
  due = due + interval
  slots[#slots + 1] = slot
  local wait = slot - now_ms()
  return wait > 0 and wait or 0
end

local function patch(n, number)
  local body = string.format('{"inventory":{"shelf_7":"item_%d"}}', number)
  return wrk.format("PATCH", paths[n], {
    ["Authorization"] = "Bearer " .. key,
    ["Content-Type"] = "application/merge-patch+json",
    ["If-Match"] = '"' .. versions[n] .. '"',
  }, body)
end

function request()
  if armed == 0 then
    -- wrk checking the request at the start: it is never sent.
    return patch(1, 0)
  end
  armed = armed - 1
  local n = table.remove(idle, 1)
  if n == nil then
    error("bench-http-patch.lua: a connection was ready while every task of its thread was in flight")
  end
  counter = counter + 1
  flying[n] = 1
  local at
  if rate then
    at = table.remove(slots, 1) or now_ms()
  else
    at = now_ms()
  end
  sent[counter] = n
  sent_at[n] = at
  return patch(n, counter)
end

function response(status, headers, body)
  -- A 200 holds the state with this thread's unique patch value; a problem names the state's
  -- path as its instance.
  local number = tonumber(body:match('"shelf_7":"item_(%d+)"') or "")
  local n = number and sent[number]
  if number then sent[number] = nil end
  if n == nil then
    n = by_path[body:match('"instance":"([^"]+)"') or ""]
  end
  if status ~= 200 then
    not_ok = not_ok + 1
    if #statuses < 200 then statuses = statuses .. " " .. status end
  end
  if n == nil then
    -- Which task this answered is unknown: the run fails (answers other than 200 are
    -- counted), and wrk stops at the next send of this thread.
    not_ok = not_ok + 1
    return
  end
  flying[n] = 0
  local bucket = math.min(math.floor((now_ms() - sent_at[n]) / BUCKET_MS), BUCKETS - 1)
  histogram[bucket] = (histogram[bucket] or 0) + 1
  if status == 200 then
    oks[n] = oks[n] + 1
    local tag = headers["etag"] or headers["ETag"] or ""
    versions[n] = tonumber(tag:match('"(%d+)"')) or -1
  end
  idle[#idle + 1] = n
end

function done(summary, latency, requests)
  local out = assert(io.open(os.getenv("BENCH_OUT"), "w"))
  local total_ok, total_bad = 0, 0
  local counts, answered = {}, 0
  for _, thread in ipairs(threads) do
    local ids, oks, versions, flying =
      thread:get("ids"), thread:get("oks"), thread:get("versions"), thread:get("flying")
    for n, id in ipairs(ids) do
      out:write(string.format("%s %d %d %d\n", id, oks[n], versions[n], flying[n]))
      total_ok = total_ok + oks[n]
    end
    total_bad = total_bad + thread:get("not_ok")
    local seen = thread:get("statuses")
    if seen ~= "" then io.write("bench: thread " .. thread:get("index") .. " answered" .. seen .. "\n") end
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
