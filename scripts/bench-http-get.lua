-- wrk script of scripts/bench-http: GET /v1/tasks/{id}/state, the connections of each thread
-- taking the benchmark's tasks in turn.
--
-- Environment: BENCH_TASKS (a file of lines `<task id> <version>`), BENCH_KEY (the API key).

local ids = {}
for line in io.lines(os.getenv("BENCH_TASKS")) do
  local id = line:match("^(%S+)")
  if id then ids[#ids + 1] = id end
end
local key = os.getenv("BENCH_KEY")

local threads = {}
local next_thread = 0

function setup(thread)
  thread:set("offset", next_thread)
  next_thread = next_thread + 1
  table.insert(threads, thread)
end

function init(args)
  paths = {}
  for i, id in ipairs(ids) do
    paths[i] = "/v1/tasks/" .. id .. "/state"
  end
  turn = offset
  headers = { ["Authorization"] = "Bearer " .. key }
  not_ok = 0
end

function request()
  turn = turn + 1
  return wrk.format("GET", paths[turn % #paths + 1], headers)
end

function response(status, headers, body)
  if status ~= 200 then
    not_ok = not_ok + 1
  end
end

function done(summary, latency, requests)
  local bad = 0
  for _, thread in ipairs(threads) do
    bad = bad + thread:get("not_ok")
  end
  io.write(string.format("bench: GET answers other than 200: %d\n", bad))
end
