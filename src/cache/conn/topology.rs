//! A cluster's topology as chirp reads it: masters and nodes (`CLUSTER NODES`), which master
//! serves each hash slot, and where a command goes.

use redis::cluster_routing::Slot;
use redis::{Arg, Cmd};

/// A cluster master: its address and the slot ranges (inclusive) it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    /// `(host, port)`.
    pub addr: (String, u16),
    /// Inclusive slot ranges.
    pub slots: Vec<(u16, u16)>,
}

impl Master {
    /// Whether it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// A cluster node, from `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The node id.
    pub id: String,
    /// `(host, port)`.
    pub addr: (String, u16),
    /// A master (else a replica).
    pub master: bool,
    /// A master that serves slots.
    pub serves: bool,
    /// A replica's master (its node id).
    pub replica_of: Option<String>,
}

/// Every node in `CLUSTER NODES` output (but those without an address).
pub(super) fn parse_all_nodes(text: &str) -> Vec<Node> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if flags.split(',').any(|f| f == "noaddr" || f == "handshake") {
                return None;
            }
            let addr = fields.get(1)?.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            let master = flags.split(',').any(|f| f == "master");
            Some(Node {
                id: (*fields.first()?).to_owned(),
                addr: (host.to_owned(), port.parse().ok()?),
                master,
                serves: master && fields.len() > 8,
                replica_of: fields
                    .get(3)
                    .filter(|m| !master && **m != "-")
                    .map(|m| (*m).to_owned()),
            })
        })
        .collect()
}

/// The masters in `CLUSTER NODES` output that serve slots, with their slots.
pub fn parse_nodes(text: &str) -> Vec<Master> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Every master that serves slots, also one flagged `fail?` or `fail` (a scan of
            // the prefix must not skip it: it then fails, and is tried again).
            let flags = fields.get(2)?;
            if !flags.split(',').any(|f| f == "master") {
                return None;
            }
            let addr = fields.get(1)?.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            let slots = fields
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect::<Vec<_>>();
            if slots.is_empty() {
                return None;
            }
            Some(Master {
                addr: (host.to_owned(), port.parse().ok()?),
                slots,
            })
        })
        .collect()
}

/// Where a pipeline command goes on a cluster: with the commands of its slot, or on its own.
pub(super) fn placement(cmd: &Cmd) -> Option<Slot> {
    routing_key(cmd).map(Slot::for_key)
}

/// The key a pipeline command is routed by on a cluster; `None`: it goes on its own.
pub(super) fn routing_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().map(|a| match a {
        Arg::Simple(bytes) => bytes,
        _ => &[][..],
    });
    let name = args.next()?.to_ascii_uppercase();
    let key = match name.as_slice() {
        b"EVALSHA" | b"EVAL" => {
            let _script = args.next()?;
            let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
            if keys == 0 {
                return None;
            }
            args.next()?
        }
        // Multi-key commands: with their slot's commands when every key is in one slot (one
        // owner's keys: `EXISTS list gen`), else on their own (redis-rs splits them).
        b"MGET" | b"DEL" | b"UNLINK" | b"EXISTS" | b"TOUCH" => {
            let key = args.next()?;
            let slot = key_slot(key);
            if args.any(|k| key_slot(k) != slot) {
                return None;
            }
            key
        }
        // Keyless or multi-node commands: redis-rs routes them.
        b"PING" | b"INFO" | b"CONFIG" | b"SCAN" | b"WAIT" | b"SCRIPT" | b"CLUSTER" | b"PUBSUB"
        | b"KEYS" | b"FLUSHALL" | b"FLUSHDB" | b"DBSIZE" | b"MEMORY" | b"OBJECT" | b"CLIENT"
        | b"TIME" | b"ECHO" | b"MSET" => return None,
        // PUBLISH goes to the master of its channel's slot, where this process's subscribers
        // listen (see `super::pubsub`), so its receiver count is theirs.
        _ => args.next()?,
    };
    Some(key)
}

/// Which master serves each of the 16384 hash slots.
#[derive(Debug)]
pub struct SlotMap {
    pub(super) masters: Vec<(String, u16)>,
    /// Per slot, an index into `masters` (`u16::MAX`: none).
    owner: Vec<u16>,
}

impl SlotMap {
    /// The map of `masters` (from [`super::Session::masters`]).
    pub fn new(masters: &[Master]) -> Self {
        let mut owner = vec![u16::MAX; 16384];
        for (i, m) in masters.iter().enumerate() {
            for &(a, b) in &m.slots {
                for slot in a..=b.min(16383) {
                    owner[usize::from(slot)] = u16::try_from(i).unwrap_or(u16::MAX);
                }
            }
        }
        SlotMap {
            masters: masters.iter().map(|m| m.addr.clone()).collect(),
            owner,
        }
    }

    pub(super) fn master_of(&self, key: &[u8]) -> Option<usize> {
        let i = *self.owner.get(usize::from(key_slot(key)))?;
        (usize::from(i) < self.masters.len()).then_some(usize::from(i))
    }
}

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{` and
/// the next `}`, if not empty) or of the whole key, mod 16384 (the Redis Cluster spec).
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_placed_by_their_first_key_or_alone() {
        let slot = |c: &Cmd| placement(c);
        let mut eval = redis::cmd("EVALSHA");
        eval.arg("abc")
            .arg(2)
            .arg("p:{u42}:home")
            .arg("p:{u42}:home:gen");
        assert_eq!(slot(&eval), Some(Slot::for_key("{u42}")));
        let mut get = redis::cmd("GET");
        get.arg("p:{t7}:tweet");
        assert_eq!(slot(&get), Some(Slot::for_key("t7")));
        let mut mget = redis::cmd("MGET");
        mget.arg("p:{t7}:tweet").arg("p:{t8}:tweet");
        assert_eq!(slot(&mget), None);
        let mut exists = redis::cmd("EXISTS");
        exists.arg("p:{u42}:home:gen").arg("p:{u42}:home");
        assert_eq!(
            slot(&exists),
            Some(Slot::for_key("u42")),
            "one owner's keys"
        );
        let mut del = redis::cmd("DEL");
        del.arg("p:{u42}:home").arg("p:{u43}:home");
        assert_eq!(slot(&del), None, "keys of two slots");
        let mut ping = redis::cmd("PING");
        ping.arg("x");
        assert_eq!(slot(&ping), None);
    }

    #[test]
    fn key_slots_follow_the_cluster_spec() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"p:{u42}:home"), key_slot(b"u42"));
        assert_eq!(key_slot(b"p:{}:x"), key_slot(b"p:{}:x"));
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        for key in [&b"p:{t17}:tweet"[..], b"a{b}c", b"{}x"] {
            assert_eq!(Slot::for_key(key), Slot::new(key_slot(key)).unwrap());
        }
    }

    #[test]
    fn cluster_nodes_output_gives_the_masters_and_their_slots() {
        let text = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922 [93-<-x]
c3 127.0.0.1:7002@17002 master,fail - 0 0 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 0 1 connected
";
        let masters = parse_nodes(text);
        assert_eq!(masters.len(), 3, "a failing master still serves its slots");
        assert_eq!(masters[0].addr, ("127.0.0.1".to_owned(), 7000));
        assert_eq!(masters[1].slots, vec![(5461, 10922)]);
        assert_eq!(masters[2].slots, vec![(10923, 16383)]);
        assert!(masters[0].serves(5460) && !masters[0].serves(5461));
        let nodes = parse_all_nodes(text);
        assert_eq!(nodes.len(), 4);
        assert!(nodes[0].serves && nodes[2].serves && !nodes[3].master && !nodes[3].serves);
        assert_eq!(nodes[3].replica_of.as_deref(), Some("a1"));
        assert_eq!(nodes[0].replica_of, None);
    }
}
