//! How a timeline entry is stored in its cached list (a sorted set): a score of whole seconds
//! and a member of packed ids with the sub-second part in front
//! (docs/decisions/0014-split-time-entries-without-author.md), and a newsfeed entry's shift
//! above its tweet's time (docs/decisions/0001-newsfeed-entry-times.md). The list primitives
//! that read and write such lists are in [`super::lists`].

use super::lists::Scored;

/// Packs positive ids into compact binary (Twitter kept its timeline entries as packed binary
/// too, at 20 bytes each): a header byte, then each id big-endian in as few bytes as it needs
/// (1–8). The header holds `length − 1` of every id but the last in 3-bit fields (so at most
/// three ids, and its top two bits are clear); the last id's length is what remains.
pub fn pack_ids(ids: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 8 * ids.len());
    pack_ids_into(&mut out, ids);
    out
}

fn pack_ids_into(out: &mut Vec<u8>, ids: &[i64]) {
    debug_assert!((1..=3).contains(&ids.len()));
    let at = out.len();
    out.push(0);
    let mut header = 0u8;
    for (i, id) in ids.iter().enumerate() {
        let bytes = id.to_be_bytes();
        let skip = (id.leading_zeros() / 8).min(7) as usize;
        if i + 1 < ids.len() {
            header |= ((7 - skip) as u8) << (3 * i);
        }
        out.extend_from_slice(&bytes[skip..]);
    }
    out[at] = header;
}

/// Unpacks [`pack_ids`] holding exactly `N` ids; `None` for anything else.
pub fn unpack_ids<const N: usize>(member: &[u8]) -> Option<[i64; N]> {
    let (&header, mut rest) = member.split_first()?;
    let mut ids = [0i64; N];
    for (i, id) in ids.iter_mut().enumerate() {
        let len = if i + 1 < N {
            usize::from((header >> (3 * i)) & 7) + 1
        } else {
            rest.len()
        };
        if len == 0 || len > 8 || rest.len() < len {
            return None;
        }
        let (bytes, tail) = rest.split_at(len);
        *id = bytes.iter().fold(0i64, |v, b| (v << 8) | i64::from(*b));
        rest = tail;
    }
    Some(ids)
}

/// The second (Unix time) that a timeline score 0 stands for: 2000-01-01T00:00:00Z. Scores are
/// whole seconds since then, which Redis keeps in a listpack as a 32-bit integer (6 bytes with
/// its entry header, against 10 for a µs timestamp) until 2068.
pub const SCORE_EPOCH_SECS: i64 = 946_684_800;

const MICROS: i64 = 1_000_000;

/// Splits a time in µs into its timeline score (whole seconds since [`SCORE_EPOCH_SECS`]) and
/// its sub-second part (0–999,999 µs).
pub fn split_time(micros: i64) -> (i64, u32) {
    let sub = micros.rem_euclid(MICROS);
    // 0 ≤ sub < 10^6 fits a u32.
    (
        micros.div_euclid(MICROS) - SCORE_EPOCH_SECS,
        u32::try_from(sub).unwrap_or(0),
    )
}

/// The list entry of an item at `micros` naming `ids`, in the split-time layout: the score is
/// the item's whole second ([`split_time`]) and the member starts with its sub-second part,
/// then [`pack_ids`]. An item on a whole second (every imported tweet: Twitter's times are in
/// seconds) spends nothing on it, as the header byte's top bit is clear; any other starts with
/// three bytes `0x80 | µs >> 16, µs >> 8, µs` instead. Redis orders the members of one score
/// by their bytes, so the list's order is the items' order in µs, and a page is read with
/// `BYSCORE` ranges plus the members of a boundary second ([`Cache::range`](super::Cache::range)).
///
/// A newsfeed entry of the imported data (row id 5,781,487 and a 64-bit Twitter tweet id) is a
/// 12-byte member and a 32-bit score: 20 bytes in a listpack, against 28 for the µs score and
/// the author's id the layout before it held
/// (docs/decisions/0014-split-time-entries-without-author.md).
pub fn pack_entry(micros: i64, ids: &[i64]) -> Scored {
    let (score, sub) = split_time(micros);
    (score, pack_member(sub, ids))
}

/// The member of [`pack_entry`] for an item `sub` µs into its second (below 1,000,000).
pub fn pack_member(sub: u32, ids: &[i64]) -> Vec<u8> {
    let mut member = Vec::with_capacity(4 + 8 * ids.len());
    if sub > 0 {
        let [_, hi, mid, lo] = sub.to_be_bytes();
        member.extend_from_slice(&[0x80 | (hi & 0x7f), mid, lo]);
    }
    pack_ids_into(&mut member, ids);
    member
}

/// The sub-second part (µs) a member of [`pack_entry`] starts with, and the rest of it.
fn split_member(member: &[u8]) -> Option<(u32, &[u8])> {
    match member {
        [first, ..] if *first < 0x80 => Some((0, member)),
        [hi, mid, lo, rest @ ..] => Some((u32::from_be_bytes([0, hi & 0x7f, *mid, *lo]), rest)),
        _ => None,
    }
}

/// Unpacks a member of [`pack_entry`] naming exactly `N` ids: its sub-second part (µs) and
/// the ids; `None` for the completeness marker or anything else.
pub fn unpack_entry<const N: usize>(member: &[u8]) -> Option<(u32, [i64; N])> {
    let (sub, rest) = split_member(member)?;
    Some((sub, unpack_ids::<N>(rest)?))
}

/// The header bit of a member of [`pack_member_shifted`]: its ids carry a third value. (A header
/// of two ids uses its three low bits, of three its six low bits; the top bit must stay clear,
/// see [`pack_member`].)
const SHIFTED: u8 = 0x40;

/// The member of a newsfeed entry (`ids` = newsfeed row id, tweet id) whose time lies `shift` µs
/// past its tweet's (an entry that arrived behind newer ones: [`crate::newsfeeds::stamp`]), `sub`
/// µs into its second: [`pack_member`] of three ids, flagged in the header. `shift` 0 is the
/// plain two-id member.
pub fn pack_member_shifted(sub: u32, ids: [i64; 2], shift: i64) -> Vec<u8> {
    if shift <= 0 {
        return pack_member(sub, &ids);
    }
    let mut member = pack_member(sub, &[ids[0], ids[1], shift]);
    let header = if sub > 0 { 3 } else { 0 };
    member[header] |= SHIFTED;
    member
}

/// Unpacks a member of [`pack_member_shifted`]: its sub-second part, its two ids and its shift
/// (0 for a plain member); `None` for the marker or anything else.
pub fn unpack_shifted(member: &[u8]) -> Option<(u32, [i64; 2], i64)> {
    let (sub, rest) = split_member(member)?;
    let header = *rest.first()?;
    if header & SHIFTED == 0 {
        return Some((sub, unpack_ids::<2>(rest)?, 0));
    }
    let mut copy = [0u8; 1 + 3 * 8];
    let copy = copy.get_mut(..rest.len())?;
    copy.copy_from_slice(rest);
    copy[0] = header & !SHIFTED;
    let [id, tweet_id, shift] = unpack_ids::<3>(copy)?;
    Some((sub, [id, tweet_id], shift))
}

/// The time (µs) of an entry of [`pack_entry`] from its score and member.
pub fn entry_time(score: i64, member: &[u8]) -> Option<i64> {
    let (sub, _) = split_member(member)?;
    (score + SCORE_EPOCH_SECS)
        .checked_mul(MICROS)?
        .checked_add(i64::from(sub))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::lists::MARKER;

    #[test]
    fn shifted_newsfeed_members_round_trip_and_plain_ones_stay_as_they_were() {
        for sub in [0, 1, 65_536, 999_999] {
            for ids in [
                [1, 2],
                [5_781_487, 796_000_000_000_000_000],
                [i64::MAX, 255],
            ] {
                let plain = pack_member_shifted(sub, ids, 0);
                assert_eq!(plain, pack_member(sub, &ids));
                assert_eq!(unpack_shifted(&plain), Some((sub, ids, 0)));
                for shift in [1, 999, 86_400_000_000] {
                    let member = pack_member_shifted(sub, ids, shift);
                    assert_eq!(unpack_shifted(&member), Some((sub, ids, shift)));
                    // Its time is still the prefix: the order in a list does not change.
                    assert_eq!(split_member(&member).map(|(s, _)| s), Some(sub));
                }
            }
        }
        assert_eq!(unpack_shifted(MARKER.as_bytes()), None);
    }

    #[test]
    fn split_time_entries_round_trip_and_sort_by_time() {
        // An imported newsfeed entry: a whole second, a row id and a Twitter tweet id.
        let at = 1_478_606_400_000_000; // 2016-11-08T12:00:00Z
        let (score, member) = pack_entry(at, &[5_781_487, 796_000_000_000_000_000]);
        assert_eq!(score, 1_478_606_400 - SCORE_EPOCH_SECS);
        assert!(i32::try_from(score).is_ok(), "a 32-bit listpack integer");
        assert_eq!(member.len(), 1 + 3 + 8);
        assert_eq!(
            unpack_entry::<2>(&member),
            Some((0, [5_781_487, 796_000_000_000_000_000]))
        );
        assert_eq!(entry_time(score, &member), Some(at));
        // Inside a second: the µs lead the member, so Redis's order (score, then member
        // bytes) is the order in time, whatever the ids.
        let times = [
            at - 1_000_001,
            at - 1,
            at,
            at + 1,
            at + 65_535,
            at + 65_536,
            at + 500_000,
            at + 999_999,
            at + 1_000_000,
            0,
            -1,
        ];
        let mut entries: Vec<(i64, Scored)> = times
            .iter()
            .enumerate()
            .map(|(i, t)| (*t, pack_entry(*t, &[1 << (8 * (i % 8)), 7])))
            .collect();
        for (t, (score, member)) in &entries {
            assert_eq!(entry_time(*score, member), Some(*t));
            assert_eq!(unpack_entry::<2>(member).map(|(_, ids)| ids[1]), Some(7));
            assert!(member.as_slice() != MARKER.as_bytes());
        }
        entries.sort_by(|a, b| a.1.cmp(&b.1));
        let sorted: Vec<i64> = entries.iter().map(|(t, _)| *t).collect();
        let mut by_time = times.to_vec();
        by_time.sort_unstable();
        assert_eq!(sorted, by_time);
        assert_eq!(unpack_entry::<1>(MARKER.as_bytes()), None);
        assert_eq!(unpack_entry::<1>(&[0x85, 1]), None);
    }

    #[test]
    fn packed_ids_round_trip_in_few_bytes() {
        let feed = [5_781_487, 1_611_673_265_272_913_922, 568_770_231];
        let member = pack_ids(&feed);
        assert_eq!(member.len(), 1 + 3 + 8 + 4);
        assert_eq!(unpack_ids::<3>(&member), Some(feed));
        for ids in [
            [0, 1],
            [1, 0],
            [255, 256],
            [i64::MAX, 7],
            [1 << 40, i64::MAX],
        ] {
            let member = pack_ids(&ids);
            assert!(member.len() >= 2 && member != b"#");
            assert_eq!(unpack_ids::<2>(&member), Some(ids), "{ids:?}");
        }
        assert_eq!(unpack_ids::<2>(b"#"), None);
        assert_eq!(unpack_ids::<3>(&pack_ids(&[1, 2])), None);
        assert_eq!(unpack_ids::<2>(b""), None);
    }
}
