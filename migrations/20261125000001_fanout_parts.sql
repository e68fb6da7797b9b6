-- A big account's fan-out is split into parts that several workers share: a `fanout_part` job
-- covers the followers whose friendship's created_at is after `progress` and at most
-- `until_at` (see jobs::Job::FanoutPart).
alter table jobs add column until_at timestamptz;
alter table jobs drop constraint jobs_kind_check;
alter table jobs add constraint jobs_kind_check
    check (kind in ('fanout', 'fanout_part', 'backfill', 'unmerge', 'list_backfill', 'list_unmerge'));
