//! Listings, size queries and the records a reintegration copies: answered
//! at once from the index (applied state), with no device read.

use super::*;

impl Target {
    pub(super) fn list(&mut self, l: data::ListReq) -> Reply {
        let (pool, cont, obj) = self.addr(l.addr.as_ref(), "list")?;
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
        Ok((
            ok_response(Some(data::response::Body::List(data::ListResp {
                keys,
                anchor,
                done,
            }))),
            Vec::new(),
        ))
    }

    pub(super) fn query_size(&mut self, q: data::QuerySizeReq) -> Reply {
        let (pool, cont, obj) = self.addr(q.addr.as_ref(), "query size")?;
        self.index
            .dtx
            .check_read("query size", &pool, &cont, &obj, Some(&q.dkey), q.epoch)?;
        let (size, absent) = self
            .index
            .query_size(&pool, &cont, &obj, &q.dkey, &q.akey, q.epoch);
        Ok((
            ok_response(Some(data::response::Body::Size(data::QuerySizeResp {
                size,
                absent,
            }))),
            Vec::new(),
        ))
    }

    pub(super) fn list_changed(&mut self, l: data::ListChangedReq) -> Reply {
        const OP: &str = "list changed";
        let pool = self.pool_addr(l.addr.as_ref(), OP)?;
        let anchor = match &l.anchor {
            None => None,
            Some(k) => {
                let cont = peregrine_proto::uuid_from_bytes("anchor cont", &k.cont)
                    .map_err(|e| Errno::inval(format!("{OP}: {e}")))?;
                let oid = k
                    .oid
                    .as_ref()
                    .ok_or_else(|| Errno::inval(format!("{OP}: anchor without object id")))?;
                let obj = ObjKey {
                    hi: oid.hi,
                    lo: oid.lo,
                    shard: k.shard,
                };
                Some((cont, obj, k.dkey.clone()))
            }
        };
        let (keys, done) = self
            .index
            .list_changed(&pool, l.since, anchor.as_ref(), l.max as usize);
        let keys = keys
            .into_iter()
            .map(|(cont, obj, dkey)| data::ChangedKey {
                cont: cont.as_bytes().to_vec(),
                oid: Some(data::ObjectId {
                    hi: obj.hi,
                    lo: obj.lo,
                }),
                shard: obj.shard,
                dkey,
            })
            .collect();
        Ok((
            ok_response(Some(data::response::Body::Changed(data::ListChangedResp {
                keys,
                done,
            }))),
            Vec::new(),
        ))
    }

    pub(super) fn list_records(&mut self, l: data::ListRecordsReq) -> Reply {
        let (pool, cont, obj) = self.addr(l.addr.as_ref(), "list records")?;
        let r = peregrine_proto::EPOCH_LATEST;
        self.index
            .dtx
            .check_read("list records", &pool, &cont, &obj, Some(&l.dkey), r)?;
        let records = self
            .index
            .list_records(&pool, &cont, &obj, &l.dkey, l.since)?;
        Ok((
            ok_response(Some(data::response::Body::Records(data::ListRecordsResp {
                records,
            }))),
            Vec::new(),
        ))
    }
}
