//! What one data-plane access check costs (issue 20 point 7), apart from
//! the noise of a whole data-plane run: `Access::check` of a fetch whose
//! handle the thread checked before (every request of a client after its
//! first on that thread), with one client and with a thousand in turn (each
//! client process has its own handle), of a handle it has not (a MAC over
//! the handle: a client's first request on a thread), and with checks off
//! (the baseline: the request's address is not even read).
//!
//!   cargo bench -p peregrine-engine --bench access_check [-- --per-second N]
//!
//! With `--per-second N` (a data-plane line's requests per second, as
//! bench/access.sh passes its fastest line), it also prints each cost as a
//! share of the CPU time the engine has per request at that rate on this
//! machine's cores. bench/README.md has how to read it.

use peregrine_engine::access::Access;
use peregrine_engine::request::DataRequest as Request;
use peregrine_proto::data::{Address, FetchReq};
use peregrine_proto::handle::{new_key, Handle, Rights};
use peregrine_proto::mgmt::PoolAccess;
use std::hint::black_box;
use std::time::Instant;
use uuid::Uuid;

/// Nanoseconds per call of `f`, the best of 5 runs of `n` calls (the
/// fastest run is the one the machine disturbed least).
fn ns_per(n: u32, mut f: impl FnMut(u32)) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for i in 0..n {
                f(i);
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn fetch(pool: &Uuid, cont: &Uuid, handle: Vec<u8>) -> Request {
    Request::Fetch(FetchReq {
        addr: Some(Address {
            pool: pool.as_bytes().to_vec(),
            cont: cont.as_bytes().to_vec(),
            handle,
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn main() {
    let per_second: Option<f64> = std::env::args()
        .skip_while(|a| a != "--per-second")
        .nth(1)
        .map(|v| v.parse().expect("--per-second wants a number"));
    let (pool, key) = (Uuid::new_v4(), new_key());
    let on = Access::new(true);
    on.install(
        pool,
        &PoolAccess {
            key: key.clone(),
            key_version: 1,
            revoked: vec![],
        },
    )
    .unwrap();
    let off = Access::new(false);
    // A handle per client: more than a thread remembers (4096), so that
    // taking them all in turn verifies every time; the first 1000 alone fit.
    let reqs: Vec<Request> = (0..10_000)
        .map(|_| {
            let cont = Uuid::new_v4();
            let h = Handle::issue(
                &key,
                1,
                &pool,
                cont.as_bytes(),
                Uuid::new_v4(),
                Rights::READ,
            );
            fetch(&pool, &cont, h.encode())
        })
        .collect();

    let cached = ns_per(2_000_000, |_| on.check(black_box(&reqs[0])).unwrap());
    let cached_many = ns_per(2_000_000, |i| {
        on.check(black_box(&reqs[i as usize % 1000])).unwrap()
    });
    let verified = ns_per(100_000, |i| {
        on.check(black_box(&reqs[i as usize % reqs.len()])).unwrap()
    });
    let disabled = ns_per(2_000_000, |_| off.check(black_box(&reqs[0])).unwrap());

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    println!("access check (ns per request; best of 5 runs):");
    for (what, ns) in [
        ("one client's handle, checked before", cached),
        ("1000 clients' handles in turn", cached_many),
        ("a handle not checked before (MAC)", verified),
        ("checks off", disabled),
    ] {
        match per_second {
            // The engine's CPU time per request at that rate, all cores busy.
            Some(r) => {
                let budget = cores * 1e9 / r;
                println!(
                    "  {what:<38} {ns:>8.1} ns  {:>6.2}% of {budget:.0} ns per request ({r:.0}/s on {cores} cores)",
                    100.0 * (ns - disabled) / budget
                );
            }
            None => println!("  {what:<38} {ns:>8.1} ns"),
        }
    }
}
