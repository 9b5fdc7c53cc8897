//! Listings, size queries and the records a reintegration copies: answered
//! at once from the index (applied state), with no device read.

use super::*;
use crate::request::{ChangedKey, ListChangedReq, ListRecordsReq, ListReq, ObjectId, QuerySizeReq};

impl Target {
    pub(super) fn list(&mut self, l: ListReq) -> Reply {
        let (pool, cont, obj) = self.addr(&l.addr, "list")?;
        let dkey = (!l.dkey.is_empty()).then_some(l.dkey.as_slice());
        self.index
            .dtx
            .check_read("list", &pool, &cont, &obj, dkey, l.epoch)?;
        let max = if l.max == 0 {
            DEFAULT_LIST_MAX
        } else {
            l.max as usize
        };
        let (keys, done) = self
            .index
            .list(&pool, &cont, &obj, &l.dkey, &l.anchor, max, l.epoch);
        let anchor = keys.last().cloned().unwrap_or(l.anchor);
        Ok((Answer::List { keys, anchor, done }, Vec::new()))
    }

    pub(super) fn query_size(&mut self, q: QuerySizeReq) -> Reply {
        let (pool, cont, obj) = self.addr(&q.addr, "query size")?;
        if let Some(before) = &q.last {
            self.index
                .dtx
                .check_read("query size", &pool, &cont, &obj, None, q.epoch)?;
            let a = self.index.last_sized(
                &pool,
                &cont,
                &obj,
                &q.akey,
                before,
                q.epoch,
                crate::LAST_SCAN_MAX,
            );
            return Ok((a, Vec::new()));
        }
        self.index
            .dtx
            .check_read("query size", &pool, &cont, &obj, Some(&q.dkey), q.epoch)?;
        let (size, absent) = self
            .index
            .query_size(&pool, &cont, &obj, &q.dkey, &q.akey, q.epoch);
        Ok((Answer::Size { size, absent }, Vec::new()))
    }

    pub(super) fn list_changed(&mut self, l: ListChangedReq) -> Reply {
        let pool = self.pool_addr(&l.addr, "list changed")?;
        let anchor = l.anchor.map(|k| {
            let obj = ObjKey {
                hi: k.oid.hi,
                lo: k.oid.lo,
                shard: k.shard,
            };
            (k.cont, obj, k.dkey)
        });
        let (keys, done) = self
            .index
            .list_changed(&pool, l.since, anchor.as_ref(), l.max as usize);
        let keys = keys
            .into_iter()
            .map(|(cont, obj, dkey)| ChangedKey {
                cont,
                oid: ObjectId {
                    hi: obj.hi,
                    lo: obj.lo,
                },
                shard: obj.shard,
                dkey,
            })
            .collect();
        Ok((Answer::Changed { keys, done }, Vec::new()))
    }

    pub(super) fn list_records(&mut self, l: ListRecordsReq) -> Reply {
        let (pool, cont, obj) = self.addr(&l.addr, "list records")?;
        let r = peregrine_proto::EPOCH_LATEST;
        self.index
            .dtx
            .check_read("list records", &pool, &cont, &obj, Some(&l.dkey), r)?;
        let records = self
            .index
            .list_records(&pool, &cont, &obj, &l.dkey, l.since)?;
        Ok((Answer::Records(records), Vec::new()))
    }
}
