-- The trace id of the request (or job) that queued each job (32 hex digits; null for jobs
-- queued outside a request, e.g. by `chirp import`): a slow fan-out can be followed back to
-- its post (src/trace.rs).
alter table jobs add column trace_id text;
