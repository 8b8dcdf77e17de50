-- OpenTelemetry traces across the queue (docs/operations/telemetry.md): the W3C `traceparent`
-- of the request that created a task, so that the worker that runs it — another process,
-- perhaps on another machine — continues that trace. NULL for tasks created untraced, or
-- before this column existed. Only a value that parsed as W3C Trace Context, re-formatted,
-- is ever stored: no text a client sent as is.
ALTER TABLE tasks ADD COLUMN trace_context TEXT;
