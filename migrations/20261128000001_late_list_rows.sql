-- A list timeline's refresh (`created_at__gt` alone) also returns rows older than its cursor that
-- arrived after it (a new member's backfill, a late fan-out). Neither index could apply both
-- bounds (`arrived_at > gt` and `created_at < gt`), so a refresh from the middle of a long
-- list scanned half of it (review 2026-11-26, finding 11). Rows arrive within milliseconds of
-- their tweet except those: the refresh now reads the rows created in the last second before
-- the cursor through the primary key, and the late ones through this index of late rows
-- only (`lists::late_arrivals`).
drop index if exists list_feeds_list_arrived_idx;
create index list_feeds_late_idx on list_feeds (list_id, arrived_at)
    where arrived_at - created_at > interval '1 second';
