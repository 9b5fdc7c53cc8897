//! The engine's part in distributed transactions (the client library's
//! `dtx` module drives them): settling those whose client stopped driving
//! them ([`resolve`]).

mod resolve;

use crate::node::Node;
use peregrine::placement::PoolMap;
use peregrine::Client;
use peregrine_vos::{Answer, PoolAddress, Request, Storage};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Start the resolver.
pub fn spawn(node: Arc<Node>) {
    resolve::spawn(node);
}

/// Pool maps, fetched from the management service when needed.
#[derive(Default)]
struct Maps {
    client: Option<Client>,
    pools: HashMap<Uuid, peregrine::Pool>,
    fetched: HashMap<Uuid, Instant>,
}

impl Maps {
    /// The pool's map, no older than `max_age` (0: asked for now).
    fn map(
        &mut self,
        mgmt: &str,
        pool: Uuid,
        max_age: Duration,
    ) -> Result<(Arc<PoolMap>, Client), String> {
        if self.client.is_none() {
            let c = crate::tls::own_client(mgmt, &crate::tls::security()?)
                .map_err(|e| e.to_string())?;
            self.client = Some(c);
        }
        let client = self.client.clone().expect("set above");
        if let std::collections::hash_map::Entry::Vacant(v) = self.pools.entry(pool) {
            v.insert(
                client
                    .pool_connect(&pool.to_string())
                    .map_err(|e| e.to_string())?,
            );
        }
        let p = &self.pools[&pool];
        let fresh = self
            .fetched
            .get(&pool)
            .is_some_and(|t| t.elapsed() < max_age);
        let map = if fresh {
            p.map()
        } else {
            let m = p.refresh().map_err(|e| e.to_string())?;
            self.fetched.insert(pool, Instant::now());
            m
        };
        Ok((map, client))
    }
}

fn local(st: &Storage, req: Request) -> Result<Answer, String> {
    match st.submit(req).recv() {
        Ok(Ok((answer, _))) => Ok(answer),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("target gone".into()),
    }
}

fn addr(pool: Uuid, target: u32) -> PoolAddress {
    PoolAddress { pool, target }
}
