//! C ABI (see `include/peregrine.h`, which documents every function).
//!
//! Rules kept by every function here: handles are opaque boxes; every
//! function returns 0 (or a count) or a negative errno; the detailed message
//! of a failure is kept per thread for `prg_last_error()`; a Rust panic
//! never crosses the boundary (it becomes `-EIO`).
//!
//! # Safety
//! Every function takes raw pointers from C; the contract for each (valid
//! handles, buffers of the stated length, lifetimes of async buffers) is in
//! `peregrine.h`, which is why the per-function `# Safety` sections are
//! not repeated here. NULL pointers are checked and give `-EINVAL`.
#![allow(clippy::missing_safety_doc)]
// Every `unsafe extern "C"` function here uses its caller's raw pointers
// only as `peregrine.h` says the caller allows: through the NULL-checking
// helpers below (`cstr`, `bytes`, `bytes_mut`, `handle`, `out`, `free`),
// `Box::from_raw` of a handle this module made, or the caller's callback.
// A commented `unsafe {}` block around each of those ~90 calls would
// restate that one contract each time.
#![allow(unsafe_op_in_unsafe_fn)]

use crate::error::{Error, Result};
use crate::sync::{Condvar, Mutex};
use crate::{Client, Container, Object, Pool};
use peregrine_proto::{ObjectClass, ObjectId, EPOCH_LATEST};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

pub struct PrgClient(Client);
pub struct PrgPool(Pool);
pub struct PrgCont(Container);
pub struct PrgObj {
    obj: Object,
    /// [`EPOCH_LATEST`] for a writable handle, else the snapshot epoch.
    epoch: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PrgObjId {
    pub hi: u64,
    pub lo: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PrgEvent {
    pub user_tag: *mut c_void,
    pub rc: i32,
    pub reserved: u32,
}

/// Callback of the list functions: non-zero stops the listing and is returned.
pub type PrgKeyCb =
    Option<unsafe extern "C" fn(key: *const c_void, len: usize, arg: *mut c_void) -> c_int>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Run `f`, turning errors into their code (and message) and panics into -EIO.
fn ffi(f: impl FnOnce() -> Result<c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(rc)) => rc,
        Ok(Err(e)) => {
            set_last_error(&e.msg);
            e.code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_last_error(&format!("internal error (panic): {what}"));
            -libc::EIO
        }
    }
}

fn null(what: &str) -> Error {
    Error::inval(format!("{what} is NULL"))
}

unsafe fn cstr<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(null(what));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|_| Error::inval(format!("{what} is not UTF-8")))
}

unsafe fn bytes<'a>(p: *const c_void, len: usize, what: &str) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(null(what));
    }
    Ok(std::slice::from_raw_parts(p as *const u8, len))
}

unsafe fn bytes_mut<'a>(p: *mut c_void, len: usize, what: &str) -> Result<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(null(what));
    }
    Ok(std::slice::from_raw_parts_mut(p as *mut u8, len))
}

unsafe fn handle<'a, T>(p: *mut T, what: &str) -> Result<&'a T> {
    p.as_ref().ok_or_else(|| null(what))
}

unsafe fn out<T>(p: *mut *mut T, v: T, what: &str) -> Result<c_int> {
    if p.is_null() {
        return Err(null(what));
    }
    *p = Box::into_raw(Box::new(v));
    Ok(0)
}

unsafe fn free<T>(p: *mut T) -> c_int {
    if p.is_null() {
        return -libc::EINVAL;
    }
    ffi(|| {
        drop(Box::from_raw(p));
        Ok(0)
    })
}

fn writable(o: &PrgObj) -> Result<&Object> {
    if o.epoch != EPOCH_LATEST {
        return Err(Error::new(
            -libc::EROFS,
            format!(
                "object {} is open read-only at epoch {}",
                o.obj.id(),
                o.epoch
            ),
        ));
    }
    Ok(&o.obj)
}

#[no_mangle]
pub unsafe extern "C" fn prg_connect(
    mgmt_addr: *const c_char,
    out_client: *mut *mut PrgClient,
) -> c_int {
    ffi(|| {
        let addr = cstr(mgmt_addr, "mgmt_addr")?;
        if out_client.is_null() {
            return Err(null("out"));
        }
        let kind = crate::TransportKind::from_env()?;
        let client = match env_agent() {
            Some(socket) => crate::agent::connect(socket, kind, env_shm())?,
            None => Client::connect_with_shm(addr, &env_security()?, kind, env_shm())?,
        };
        out(out_client, PrgClient(client), "out")
    })
}

/// The node agent's socket of C callers without a certificate:
/// `PEREGRINE_AGENT_SOCKET`, read at the first connect of the process.
fn env_agent() -> Option<&'static std::path::Path> {
    static AGENT: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    AGENT
        .get_or_init(|| {
            std::env::var_os(crate::agent::ENV_SOCKET)
                .filter(|s| !s.is_empty())
                .map(std::path::PathBuf::from)
        })
        .as_deref()
}

/// The shared-memory settings of C callers: the defaults with
/// `PEREGRINE_SHM_SPIN_US` and `PEREGRINE_SHM_DIRECT` (see
/// [`crate::shm::ShmConfig::with_vars`]), read at the first connect of the
/// process.
fn env_shm() -> crate::shm::ShmConfig {
    static SHM: std::sync::OnceLock<crate::shm::ShmConfig> = std::sync::OnceLock::new();
    SHM.get_or_init(|| crate::shm::ShmConfig::default().with_vars(|k| std::env::var(k).ok()))
        .clone()
}

/// The control plane's security of C callers: `PEREGRINE_TLS_DIR` (a
/// certificate directory) or `PEREGRINE_INSECURE=1`, read at the first
/// connect of the process (C has no flags to give it).
fn env_security() -> crate::Result<crate::Security> {
    static SECURITY: std::sync::OnceLock<std::result::Result<crate::Security, String>> =
        std::sync::OnceLock::new();
    SECURITY
        .get_or_init(crate::Security::from_env)
        .clone()
        .map_err(crate::Error::inval)
}

#[no_mangle]
pub unsafe extern "C" fn prg_disconnect(client: *mut PrgClient) -> c_int {
    free(client)
}

#[no_mangle]
pub unsafe extern "C" fn prg_pool_connect(
    client: *mut PrgClient,
    pool: *const c_char,
    out_pool: *mut *mut PrgPool,
) -> c_int {
    ffi(|| {
        let c = handle(client, "client")?;
        let id = cstr(pool, "pool")?;
        if out_pool.is_null() {
            return Err(null("out"));
        }
        out(out_pool, PrgPool(c.0.pool_connect(id)?), "out")
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_pool_disconnect(pool: *mut PrgPool) -> c_int {
    free(pool)
}

#[no_mangle]
pub unsafe extern "C" fn prg_pool_uuid(pool: *mut PrgPool, uuid: *mut u8) -> c_int {
    ffi(|| {
        let p = handle(pool, "pool")?;
        bytes_mut(uuid as *mut c_void, 16, "uuid")?.copy_from_slice(p.0.uuid().as_bytes());
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_cont_open(
    pool: *mut PrgPool,
    cont: *const c_char,
    out_cont: *mut *mut PrgCont,
) -> c_int {
    ffi(|| {
        let p = handle(pool, "pool")?;
        let id = cstr(cont, "cont")?;
        if out_cont.is_null() {
            return Err(null("out"));
        }
        out(out_cont, PrgCont(p.0.cont_open(id)?), "out")
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_cont_close(cont: *mut PrgCont) -> c_int {
    free(cont)
}

#[no_mangle]
pub unsafe extern "C" fn prg_cont_uuid(cont: *mut PrgCont, uuid: *mut u8) -> c_int {
    ffi(|| {
        let c = handle(cont, "cont")?;
        bytes_mut(uuid as *mut c_void, 16, "uuid")?.copy_from_slice(c.0.uuid().as_bytes());
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_cont_snapshot(
    cont: *mut PrgCont,
    name: *const c_char,
    epoch: *mut u64,
) -> c_int {
    ffi(|| {
        let c = handle(cont, "cont")?;
        let name = if name.is_null() {
            ""
        } else {
            cstr(name, "name")?
        };
        let e = c.0.snapshot(name)?;
        if !epoch.is_null() {
            *epoch = e;
        }
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_id_make(
    oclass: *const c_char,
    hi: u64,
    lo: u64,
    oid: *mut PrgObjId,
) -> c_int {
    ffi(|| {
        let name = cstr(oclass, "oclass")?;
        let class: ObjectClass = name
            .parse()
            .map_err(|e: peregrine_proto::oclass::UnknownClass| Error::inval(e.to_string()))?;
        if oid.is_null() {
            return Err(null("out"));
        }
        let id = ObjectId::new(class, hi, lo);
        *oid = PrgObjId {
            hi: id.hi,
            lo: id.lo,
        };
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_open(
    cont: *mut PrgCont,
    oid: PrgObjId,
    out_obj: *mut *mut PrgObj,
) -> c_int {
    prg_obj_open_at(cont, oid, EPOCH_LATEST, out_obj)
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_open_at(
    cont: *mut PrgCont,
    oid: PrgObjId,
    epoch: u64,
    out_obj: *mut *mut PrgObj,
) -> c_int {
    ffi(|| {
        let c = handle(cont, "cont")?;
        if out_obj.is_null() {
            return Err(null("out"));
        }
        let obj = c.0.object(ObjectId {
            hi: oid.hi,
            lo: oid.lo,
        })?;
        out(out_obj, PrgObj { obj, epoch }, "out")
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_close(obj: *mut PrgObj) -> c_int {
    free(obj)
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_update_single(
    obj: *mut PrgObj,
    dkey: *const c_void,
    dkey_len: usize,
    akey: *const c_void,
    akey_len: usize,
    buf: *const c_void,
    len: usize,
) -> c_int {
    ffi(|| {
        let o = writable(handle(obj, "obj")?)?;
        o.update_single(
            bytes(dkey, dkey_len, "dkey")?,
            bytes(akey, akey_len, "akey")?,
            bytes(buf, len, "buf")?,
        )?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_fetch_single(
    obj: *mut PrgObj,
    dkey: *const c_void,
    dkey_len: usize,
    akey: *const c_void,
    akey_len: usize,
    buf: *mut c_void,
    len_inout: *mut usize,
) -> c_int {
    ffi(|| {
        let o = handle(obj, "obj")?;
        if len_inout.is_null() {
            return Err(null("len_inout"));
        }
        let (d, a) = (
            bytes(dkey, dkey_len, "dkey")?,
            bytes(akey, akey_len, "akey")?,
        );
        let v = o.obj.at(o.epoch).fetch_single(d, a)?.ok_or_else(|| {
            Error::new(
                -libc::ENOENT,
                format!(
                    "object {} dkey {}: no akey {}",
                    o.obj.id(),
                    crate::error::fmt_key(d),
                    crate::error::fmt_key(a)
                ),
            )
        })?;
        let cap = *len_inout;
        *len_inout = v.len();
        if v.len() > cap {
            return Err(Error::new(
                -libc::ERANGE,
                format!("value is {} bytes, buffer {cap}", v.len()),
            ));
        }
        bytes_mut(buf, v.len(), "buf")?.copy_from_slice(&v);
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_update_array(
    obj: *mut PrgObj,
    dkey: *const c_void,
    dkey_len: usize,
    akey: *const c_void,
    akey_len: usize,
    offset: u64,
    buf: *const c_void,
    len: usize,
) -> c_int {
    ffi(|| {
        let o = writable(handle(obj, "obj")?)?;
        o.update_array(
            bytes(dkey, dkey_len, "dkey")?,
            bytes(akey, akey_len, "akey")?,
            offset,
            bytes(buf, len, "buf")?,
        )?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_fetch_array(
    obj: *mut PrgObj,
    dkey: *const c_void,
    dkey_len: usize,
    akey: *const c_void,
    akey_len: usize,
    offset: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    ffi(|| {
        let o = handle(obj, "obj")?;
        o.obj.at(o.epoch).fetch_array_into(
            bytes(dkey, dkey_len, "dkey")?,
            bytes(akey, akey_len, "akey")?,
            offset,
            bytes_mut(buf, len, "buf")?,
        )?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_array_size(
    obj: *mut PrgObj,
    dkey: *const c_void,
    dkey_len: usize,
    akey: *const c_void,
    akey_len: usize,
    size: *mut u64,
) -> c_int {
    ffi(|| {
        let o = handle(obj, "obj")?;
        if size.is_null() {
            return Err(null("size"));
        }
        *size = o.obj.at(o.epoch).array_size(
            bytes(dkey, dkey_len, "dkey")?,
            bytes(akey, akey_len, "akey")?,
        )?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_flush(obj: *mut PrgObj) -> c_int {
    ffi(|| {
        handle(obj, "obj")?.obj.flush()?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_punch(obj: *mut PrgObj) -> c_int {
    ffi(|| {
        writable(handle(obj, "obj")?)?.punch()?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_punch_dkey(
    obj: *mut PrgObj,
    dkey: *const c_void,
    dkey_len: usize,
) -> c_int {
    ffi(|| {
        writable(handle(obj, "obj")?)?.punch_dkey(bytes(dkey, dkey_len, "dkey")?)?;
        Ok(0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_punch_akeys(
    obj: *mut PrgObj,
    dkey: *const c_void,
    dkey_len: usize,
    akeys: *const *const c_void,
    akey_lens: *const usize,
    n: usize,
) -> c_int {
    ffi(|| {
        let o = writable(handle(obj, "obj")?)?;
        let d = bytes(dkey, dkey_len, "dkey")?;
        if n > 0 && (akeys.is_null() || akey_lens.is_null()) {
            return Err(null("akeys"));
        }
        let mut list = Vec::with_capacity(n);
        for i in 0..n {
            list.push(bytes(*akeys.add(i), *akey_lens.add(i), "akey")?);
        }
        o.punch_akeys(d, &list)?;
        Ok(0)
    })
}

unsafe fn call_keys(keys: Vec<Vec<u8>>, cb: PrgKeyCb, arg: *mut c_void) -> Result<c_int> {
    let cb = cb.ok_or_else(|| null("cb"))?;
    for k in keys {
        let rc = cb(k.as_ptr() as *const c_void, k.len(), arg);
        if rc != 0 {
            return Ok(rc);
        }
    }
    Ok(0)
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_list_dkeys(
    obj: *mut PrgObj,
    cb: PrgKeyCb,
    arg: *mut c_void,
) -> c_int {
    ffi(|| {
        let o = handle(obj, "obj")?;
        call_keys(o.obj.at(o.epoch).list_dkeys()?, cb, arg)
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_list_akeys(
    obj: *mut PrgObj,
    dkey: *const c_void,
    dkey_len: usize,
    cb: PrgKeyCb,
    arg: *mut c_void,
) -> c_int {
    ffi(|| {
        let o = handle(obj, "obj")?;
        call_keys(
            o.obj
                .at(o.epoch)
                .list_akeys(bytes(dkey, dkey_len, "dkey")?)?,
            cb,
            arg,
        )
    })
}

// ---- event queue ----

type Job = Box<dyn FnOnce() -> c_int + Send>;

/// Worker threads per event queue.
const EQ_WORKERS: usize = 4;

struct EqShared {
    done: Mutex<VecDeque<(usize, c_int)>>,
    cv: Condvar,
    inflight: Mutex<usize>,
}

pub struct PrgEq {
    shared: Arc<EqShared>,
    tx: Option<mpsc::Sender<(usize, Job)>>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl PrgEq {
    fn new() -> Result<PrgEq> {
        let shared = Arc::new(EqShared {
            done: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            inflight: Mutex::new(0),
        });
        let (tx, rx) = mpsc::channel::<(usize, Job)>();
        let rx = Arc::new(Mutex::new(rx));
        let mut workers = Vec::new();
        for i in 0..EQ_WORKERS {
            let (rx, sh) = (rx.clone(), shared.clone());
            let b = std::thread::Builder::new().name(format!("prg-eq-{i}"));
            let h = crate::signals::spawn_quiet(b, move || loop {
                let job = rx.lock().recv();
                let Ok((tag, job)) = job else { return };
                let rc = catch_unwind(AssertUnwindSafe(job)).unwrap_or(-libc::EIO);
                sh.done.lock().push_back((tag, rc));
                *sh.inflight.lock() -= 1;
                sh.cv.notify_all();
            })
            .map_err(|e| {
                Error::new(
                    -libc::EAGAIN,
                    format!("cannot start event queue worker: {e}"),
                )
            })?;
            workers.push(h);
        }
        Ok(PrgEq {
            shared,
            tx: Some(tx),
            workers,
        })
    }

    fn submit(&self, tag: *mut c_void, job: Job) -> Result<c_int> {
        *self.shared.inflight.lock() += 1;
        if self
            .tx
            .as_ref()
            .expect("live queue")
            .send((tag as usize, job))
            .is_err()
        {
            *self.shared.inflight.lock() -= 1;
            return Err(Error::io("event queue is shut down"));
        }
        Ok(0)
    }
}

impl Drop for PrgEq {
    fn drop(&mut self) {
        self.tx.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn prg_eq_create(out_eq: *mut *mut PrgEq) -> c_int {
    ffi(|| {
        if out_eq.is_null() {
            return Err(null("out"));
        }
        out(out_eq, PrgEq::new()?, "out")
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_eq_destroy(eq: *mut PrgEq) -> c_int {
    ffi(|| {
        let q = handle(eq, "eq")?;
        let busy = *q.shared.inflight.lock();
        if busy > 0 {
            return Err(Error::new(
                -libc::EBUSY,
                format!("event queue has {busy} operations in flight"),
            ));
        }
        drop(Box::from_raw(eq));
        Ok(0)
    })
}

/// Raw buffer pointers handed to a worker: the C caller promises they stay
/// valid until the event is reaped.
struct SendPtr(usize);
// SAFETY: the address is only turned back into a pointer by the worker, and the
// C caller keeps the buffer valid (and unaliased) until it reaps the event.
unsafe impl Send for SendPtr {}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_update_array_async(
    obj: *mut PrgObj,
    dkey: *const c_void,
    dkey_len: usize,
    akey: *const c_void,
    akey_len: usize,
    offset: u64,
    buf: *const c_void,
    len: usize,
    eq: *mut PrgEq,
    user_tag: *mut c_void,
) -> c_int {
    ffi(|| {
        let o = writable(handle(obj, "obj")?)?.clone();
        let q = handle(eq, "eq")?;
        let (d, a) = (
            bytes(dkey, dkey_len, "dkey")?.to_vec(),
            bytes(akey, akey_len, "akey")?.to_vec(),
        );
        bytes(buf, len, "buf")?;
        let p = SendPtr(buf as usize);
        q.submit(
            user_tag,
            Box::new(move || {
                let p = p;
                ffi(|| {
                    let data = bytes(p.0 as *const c_void, len, "buf")?;
                    o.update_array(&d, &a, offset, data)?;
                    Ok(0)
                })
            }),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_obj_fetch_array_async(
    obj: *mut PrgObj,
    dkey: *const c_void,
    dkey_len: usize,
    akey: *const c_void,
    akey_len: usize,
    offset: u64,
    buf: *mut c_void,
    len: usize,
    eq: *mut PrgEq,
    user_tag: *mut c_void,
) -> c_int {
    ffi(|| {
        let h = handle(obj, "obj")?;
        let (o, epoch) = (h.obj.clone(), h.epoch);
        let q = handle(eq, "eq")?;
        let (d, a) = (
            bytes(dkey, dkey_len, "dkey")?.to_vec(),
            bytes(akey, akey_len, "akey")?.to_vec(),
        );
        bytes_mut(buf, len, "buf")?;
        let p = SendPtr(buf as usize);
        q.submit(
            user_tag,
            Box::new(move || {
                let p = p;
                ffi(|| {
                    let data = bytes_mut(p.0 as *mut c_void, len, "buf")?;
                    o.at(epoch).fetch_array_into(&d, &a, offset, data)?;
                    Ok(0)
                })
            }),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_eq_poll(
    eq: *mut PrgEq,
    max: c_int,
    timeout_ms: c_int,
    events: *mut PrgEvent,
) -> c_int {
    ffi(|| {
        let q = handle(eq, "eq")?;
        if max <= 0 {
            return Err(Error::inval("max must be positive"));
        }
        if events.is_null() {
            return Err(null("events"));
        }
        let deadline =
            (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
        let mut done = q.shared.done.lock();
        loop {
            if !done.is_empty() {
                let n = done.len().min(max as usize);
                for i in 0..n {
                    let (tag, rc) = done.pop_front().unwrap();
                    *events.add(i) = PrgEvent {
                        user_tag: tag as *mut c_void,
                        rc,
                        reserved: 0,
                    };
                }
                return Ok(n as c_int);
            }
            let wait = match deadline {
                None => Duration::from_secs(3600),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(0);
                    }
                    d - now
                }
            };
            q.shared.cv.wait_for(&mut done, wait);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn prg_eq_inflight(eq: *mut PrgEq) -> c_int {
    ffi(|| {
        let q = handle(eq, "eq")?;
        let n = *q.shared.inflight.lock();
        let ready = q.shared.done.lock().len();
        Ok((n + ready) as c_int)
    })
}

// ---- errors ----

#[no_mangle]
pub extern "C" fn prg_strerror(rc: c_int) -> *const c_char {
    static CACHE: OnceLock<Mutex<HashMap<c_int, &'static CStr>>> = OnceLock::new();
    let mut m = CACHE.get_or_init(Default::default).lock();
    let rc = if rc > 0 { -rc } else { rc };
    let s = m.entry(rc).or_insert_with(|| {
        let text = catch_unwind(|| peregrine_proto::strerror(rc))
            .unwrap_or_else(|_| "unknown error".into());
        Box::leak(CString::new(text).unwrap_or_default().into_boxed_c_str())
    });
    s.as_ptr()
}

#[no_mangle]
pub extern "C" fn prg_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}
