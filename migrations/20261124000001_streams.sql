-- Streams (src/streams.rs).
--
-- Where a tweet was posted (Twitter v1.1's `coordinates` and `place`), for the location
-- predicate of the streaming filter: exact coordinates as `{lon, lat}`, and a place as
-- `{"full_name": str, "bbox": [sw_lon, sw_lat, ne_lon, ne_lat]}`. Both optional.
alter table tweets add column coordinates double precision[]
    check (coordinates is null or array_length(coordinates, 1) = 2);
alter table tweets add column place jsonb;

-- Newsfeed rows are derived data written in bulk by the fan-out, and a stream's delivery waits
-- for each batch's commit. Their two foreign keys cost two trigger calls per row, more than
-- half of a 1,000-row batch's insert (measured: 24 ms with them, 9 ms without; BENCHMARKS.md,
-- "Streams"). Nothing needs them: users are never deleted, a tweet's delete removes its rows
-- itself (tweets::delete) and excludes concurrent fan-out batches by locking the tweet row,
-- which each fan-out batch and follow backfill locks `for key share` (what the key's check did).
alter table newsfeeds drop constraint newsfeeds_user_id_fkey;
alter table newsfeeds drop constraint newsfeeds_tweet_id_fkey;

-- Streaming resume reads a reader's rows by arrival through `newsfeeds_user_arrived_idx`.
