-- Tweet photos (src/media.rs): the URLs of up to 9 images, in upload order.
alter table tweets add column photo_urls text[] not null default '{}';
