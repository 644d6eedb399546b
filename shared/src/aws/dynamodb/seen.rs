//! What one run has read of the table, so it never reads an item twice without writing it in
//! between (the read rule, README "State"). A run starts with
//! [`Store::begin_run`](crate::ports::Store::begin_run); until then nothing is kept, and each
//! run starts empty.
//!
//! Kept: items read by key (also found absent), and whole sort-key ranges of a partition
//! (`OFFER#`, `RES#`, `SLOT#`, `HIST#`). A committed put keeps what it wrote; a committed
//! update forgets its item (its result is not known here) and any range holding it; the
//! candidates (`OFFER#`) are kept with META's `offers_version` and read again after any
//! write to them or once META says another; a write
//! that did not commit forgets every item it named, so the next read is a fresh one, as
//! re-reading after a refused conditional write requires. Correctness never rests on what is
//! kept: every decision's write is conditional on the version it was read at.

use std::collections::{BTreeSet, HashMap};

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

use super::item::{Item, attr};

pub(super) type Key = (String, String);

/// The prefixes whose ranges are kept.
pub(super) const RANGES: [&str; 4] = ["OFFER#", "RES#", "SLOT#", "HIST#"];

#[derive(Debug, Default)]
pub(super) struct Seen {
    on: bool,
    /// The run's `now`: the store's time while the run lasts.
    pub(super) now: Option<chrono::DateTime<chrono::Utc>>,
    items: HashMap<Key, Option<Item>>,
    /// `(pk, prefix)` read whole: the sort keys in it, and for `OFFER#` the META
    /// `offers_version` they were read at.
    ranges: HashMap<(String, String), (BTreeSet<String>, Option<i64>)>,
}

pub(super) fn key_of(item: &Item) -> Option<Key> {
    match (item.get(attr::PK), item.get(attr::SK)) {
        (Some(AttributeValue::S(pk)), Some(AttributeValue::S(sk))) => {
            Some((pk.clone(), sk.clone()))
        }
        _ => None,
    }
}

fn prefix_of(sk: &str) -> Option<&'static str> {
    RANGES.into_iter().find(|p| sk.starts_with(p))
}

/// What a transaction item does to the key it names.
pub(super) enum Write {
    Put(Item),
    Update(Key),
    Delete(Key),
    Check(Key),
}

impl Write {
    pub(super) fn of(t: &TransactWriteItem) -> Option<Write> {
        if let Some(p) = t.put() {
            return Some(Write::Put(p.item().clone()));
        }
        if let Some(u) = t.update() {
            return key_of(u.key()).map(Write::Update);
        }
        if let Some(d) = t.delete() {
            return key_of(d.key()).map(Write::Delete);
        }
        t.condition_check()
            .and_then(|c| key_of(c.key()))
            .map(Write::Check)
    }

    fn key(&self) -> Option<Key> {
        match self {
            Write::Put(item) => key_of(item),
            Write::Update(k) | Write::Delete(k) | Write::Check(k) => Some(k.clone()),
        }
    }
}

impl Seen {
    pub(super) fn begin(&mut self, now: chrono::DateTime<chrono::Utc>) {
        self.on = true;
        self.now = Some(now);
        self.items.clear();
        self.ranges.clear();
    }

    /// The item as this run read or wrote it: `Some(None)` when it was found absent.
    pub(super) fn item(&self, key: &Key) -> Option<Option<Item>> {
        self.items.get(key).cloned()
    }

    pub(super) fn read(&mut self, key: Key, item: Option<Item>) {
        if self.on {
            self.items.insert(key, item);
        }
    }

    /// The items of `(pk, prefix)` when the run holds the range whole.
    pub(super) fn range(&self, pk: &str, prefix: &str) -> Option<Vec<Item>> {
        self.tagged_range(pk, prefix).map(|(items, _)| items)
    }

    /// The range and the tag it was read with.
    pub(super) fn tagged_range(&self, pk: &str, prefix: &str) -> Option<(Vec<Item>, Option<i64>)> {
        let (sks, tag) = self.ranges.get(&(pk.to_string(), prefix.to_string()))?;
        let items = sks
            .iter()
            .map(|sk| {
                self.items
                    .get(&(pk.to_string(), sk.clone()))
                    .cloned()
                    .flatten()
            })
            .collect::<Option<Vec<Item>>>()?;
        Some((items, *tag))
    }

    pub(super) fn read_range(&mut self, pk: &str, prefix: &str, items: &[Item]) {
        self.read_tagged_range(pk, prefix, items, None);
    }

    pub(super) fn read_tagged_range(
        &mut self,
        pk: &str,
        prefix: &str,
        items: &[Item],
        tag: Option<i64>,
    ) {
        if !self.on {
            return;
        }
        let mut sks = BTreeSet::new();
        for i in items {
            if let Some(k) = key_of(i) {
                sks.insert(k.1.clone());
                self.items.insert(k, Some(i.clone()));
            }
        }
        self.ranges
            .insert((pk.to_string(), prefix.to_string()), (sks, tag));
    }

    pub(super) fn forget(&mut self, key: &Key) {
        self.items.remove(key);
        if let Some(p) = prefix_of(&key.1) {
            self.ranges.remove(&(key.0.clone(), p.to_string()));
        }
    }

    /// After a write of `writes`; `committed` when all of it applied.
    pub(super) fn wrote(&mut self, writes: Vec<Write>, committed: bool) {
        if !self.on {
            return;
        }
        for w in writes {
            let Some(key) = w.key() else { continue };
            if !committed {
                self.forget(&key);
                continue;
            }
            let range = prefix_of(&key.1).map(|p| (key.0.clone(), p.to_string()));
            // A tagged range is rewritten whole by the write that changes it: read it again.
            if let Some(r) = &range
                && self.ranges.get(r).is_some_and(|(_, tag)| tag.is_some())
                && !matches!(w, Write::Check(_))
            {
                self.ranges.remove(r);
            }
            let kept = range.and_then(|r| self.ranges.get_mut(&r).map(|(sks, _)| sks));
            match w {
                Write::Put(item) => {
                    if let Some(sks) = kept {
                        sks.insert(key.1.clone());
                    }
                    self.items.insert(key, Some(item));
                }
                Write::Update(_) => self.forget(&key),
                Write::Delete(_) => {
                    if let Some(sks) = kept {
                        sks.remove(&key.1);
                    }
                    self.items.insert(key, None);
                }
                Write::Check(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::dynamodb::item::{key, s};

    fn item(pk: &str, sk: &str, v: &str) -> Item {
        let mut i = key(pk.to_string(), sk);
        i.insert("v".into(), s(v));
        i
    }

    #[test]
    fn nothing_is_kept_before_a_run_begins_and_each_run_starts_empty() {
        let mut seen = Seen::default();
        let k = ("REQ#a".to_string(), "META".to_string());
        seen.read(k.clone(), Some(item("REQ#a", "META", "1")));
        assert_eq!(seen.item(&k), None);
        seen.begin(chrono::Utc::now());
        seen.read(k.clone(), Some(item("REQ#a", "META", "1")));
        assert!(seen.item(&k).is_some());
        seen.begin(chrono::Utc::now());
        assert_eq!(seen.item(&k), None);
    }

    #[test]
    fn a_committed_put_is_kept_an_update_forgets_and_a_refused_write_forgets_all_it_named() {
        let mut seen = Seen::default();
        seen.begin(chrono::Utc::now());
        let pk = "REQ#a";
        seen.read_range(pk, "SLOT#", &[item(pk, "SLOT#x#00000", "0")]);
        seen.read((pk.into(), "META".into()), Some(item(pk, "META", "1")));
        // a put into the range keeps the range whole; an update of META forgets META only
        seen.wrote(
            vec![
                Write::Put(item(pk, "SLOT#x#00001", "1")),
                Write::Update((pk.into(), "META".into())),
            ],
            true,
        );
        assert_eq!(seen.range(pk, "SLOT#").map(|r| r.len()), Some(2));
        assert_eq!(seen.item(&(pk.into(), "META".into())), None);
        // a refused write forgets the range its item is in
        seen.wrote(vec![Write::Put(item(pk, "SLOT#x#00002", "2"))], false);
        assert_eq!(seen.range(pk, "SLOT#"), None);
        // a delete is kept as absent
        seen.read(
            (pk.into(), "OFFER#0001".into()),
            Some(item(pk, "OFFER#0001", "o")),
        );
        seen.wrote(vec![Write::Delete((pk.into(), "OFFER#0001".into()))], true);
        assert_eq!(seen.item(&(pk.into(), "OFFER#0001".into())), Some(None));
    }
}
