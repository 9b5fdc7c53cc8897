//! Object commands, through the (blocking) client library.
//!
//! Array values are moved in `PIECE`-sized updates and fetches, several in
//! flight at once, so a large file neither sits whole in memory nor becomes
//! one huge request, and the engines' targets work in parallel.

use crate::args::{ObjCmd, ObjGetArgs, ObjLsArgs, ObjPutArgs, ObjTarget};
use crate::parse::format_oid;
use anyhow::{anyhow, bail, Context, Result};
use peregrine::{Client, Object};
use serde_json::{json, Value};
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

/// Bytes per array request.
const PIECE: usize = 1 << 20;
/// Array requests in flight at once.
const IN_FLIGHT: usize = 8;

/// Where pool connects and container opens go.
pub enum Service<'a> {
    /// The management service, with this process's certificate.
    Mgmt {
        addr: &'a str,
        security: &'a peregrine::Security,
    },
    /// The node agent's socket: the agent holds the node's certificate and
    /// names this process by its uid.
    Agent(&'a Path),
}

pub fn run(
    svc: &Service,
    _timeout: Duration,
    cmd: ObjCmd,
    json: bool,
    o: &mut impl Write,
) -> Result<()> {
    match cmd {
        ObjCmd::Put(a) => put(svc, a, json, o),
        ObjCmd::Get(a) => get(svc, a, json, o),
        ObjCmd::Ls(a) => ls(svc, a, json, o),
    }
}

/// A client error as the reason part of the one-line message.
fn client_err(e: peregrine::Error) -> anyhow::Error {
    anyhow!("{}", e.msg)
}

/// Connect to the service. A failure gets the same wording as the management
/// commands (and no command context), so scripts see one form.
fn connect(svc: &Service) -> Result<Client> {
    // The command's environment, read here once: the transport
    // (`PEREGRINE_TRANSPORT`) and its shared-memory settings.
    let shm = peregrine::shm::ShmConfig::default().with_vars(|k| std::env::var(k).ok());
    let kind = peregrine::TransportKind::from_env().map_err(client_err)?;
    match svc {
        Service::Agent(socket) => peregrine::agent::connect(socket, kind, shm)
            .map_err(|e| anyhow!("cannot reach the node agent: {}", e.msg)),
        Service::Mgmt { addr, security } => Client::connect_with_shm(addr, security, kind, shm)
            .map_err(|e| {
                let reason = if e.msg.contains("Connection refused") {
                    "connection refused".to_string()
                } else if e.code == -libc::ETIMEDOUT {
                    "timed out".to_string()
                } else {
                    e.msg
                        .trim_start_matches(&format!("management service {addr}: "))
                        .to_string()
                };
                anyhow!("cannot reach management service at {addr}: {reason}")
            }),
    }
}

/// Open the object; the client's messages already name the pool or container.
fn open(client: &Client, t: &ObjTarget) -> Result<Object> {
    let pool = client.pool_connect(&t.pool).map_err(client_err)?;
    let cont = pool.cont_open(&t.cont).map_err(client_err)?;
    cont.object(t.oid).map_err(client_err)
}

fn what(verb: &str, t: &ObjTarget, dkey: &str, akey: &str) -> String {
    format!("obj {verb} {} {dkey:?}/{akey:?}", format_oid(&t.oid))
}

fn put(svc: &Service, a: ObjPutArgs, json: bool, o: &mut impl Write) -> Result<()> {
    let what = what("put", &a.target, &a.dkey, &a.akey);
    let (dkey, akey) = (a.dkey.as_bytes(), a.akey.as_bytes());
    let mut source: Box<dyn Read> = match (&a.value, &a.file) {
        (Some(v), _) => Box::new(std::io::Cursor::new(v.clone().into_bytes())),
        (None, Some(p)) => {
            Box::new(File::open(p).with_context(|| format!("{what}: {}", p.display()))?)
        }
        (None, None) => bail!("{what}: give --value or --file"),
    };
    let client = connect(svc)?;
    let obj = open(&client, &a.target).context(what.clone())?;
    let bytes = if a.array {
        put_array(&obj, dkey, akey, a.offset, &mut source).context(what.clone())?
    } else {
        let mut v = Vec::new();
        source
            .read_to_end(&mut v)
            .with_context(|| format!("{what}: reading the value"))?;
        obj.update_single(dkey, akey, &v)
            .map_err(client_err)
            .context(what.clone())?;
        v.len() as u64
    };
    if json {
        let v = json!({"oid": format_oid(&a.target.oid), "dkey": a.dkey, "akey": a.akey, "array": a.array, "bytes": bytes});
        writeln!(o, "{v}")?;
    }
    Ok(())
}

/// Read `src` to its end, writing it at `offset` of the array; returns the bytes written.
fn put_array(
    obj: &Object,
    dkey: &[u8],
    akey: &[u8],
    offset: u64,
    src: &mut dyn Read,
) -> Result<u64> {
    let mut done = 0u64;
    loop {
        // Fill a batch of pieces, then send them together.
        let mut batch: Vec<(u64, Vec<u8>)> = Vec::with_capacity(IN_FLIGHT);
        let mut eof = false;
        while batch.len() < IN_FLIGHT && !eof {
            let mut buf = vec![0u8; PIECE];
            let n = read_full(src, &mut buf).context("reading the value")?;
            eof = n < PIECE;
            if n > 0 {
                buf.truncate(n);
                batch.push((offset + done, buf));
                done += n as u64;
            }
        }
        parallel(&batch, |(off, buf)| {
            obj.update_array(dkey, akey, *off, buf).map_err(client_err)
        })?;
        if eof {
            return Ok(done);
        }
    }
}

/// Run `f` over `items` on scoped threads, returning the first error.
fn parallel<T: Sync>(items: &[T], f: impl Fn(&T) -> Result<()> + Sync) -> Result<()> {
    if items.len() <= 1 {
        return items.iter().try_for_each(&f);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = items.iter().map(|it| s.spawn(|| f(it))).collect();
        let mut first = Ok(());
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(anyhow!("an I/O thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

fn read_full(src: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn get(svc: &Service, a: ObjGetArgs, json: bool, o: &mut impl Write) -> Result<()> {
    let what = what("get", &a.target, &a.dkey, &a.akey);
    let (dkey, akey) = (a.dkey.as_bytes(), a.akey.as_bytes());
    let client = connect(svc)?;
    let obj = open(&client, &a.target).context(what.clone())?;
    let mut file = match &a.out {
        Some(p) => Some(File::create(p).with_context(|| format!("{what}: {}", p.display()))?),
        None => None,
    };
    if !a.array {
        let v = obj
            .fetch_single(dkey, akey)
            .map_err(client_err)
            .context(what.clone())?
            .ok_or_else(|| anyhow!("{what}: no such value"))?;
        return emit(&v, file.as_mut(), json, o, &a.out).context(what);
    }
    let len = match a.len {
        Some(l) => l.0,
        None => {
            let size = obj
                .array_size(dkey, akey)
                .map_err(client_err)
                .context(what.clone())?;
            if size == 0 {
                bail!("{what}: no such array (or it is empty)");
            }
            size.saturating_sub(a.offset)
        }
    };
    if file.is_none() && json {
        // JSON carries the value inline, so it is fetched whole.
        let v = obj
            .fetch_array(dkey, akey, a.offset, len as usize)
            .map_err(client_err)
            .context(what.clone())?;
        return emit(&v, None, true, o, &None).context(what);
    }
    let mut done = 0u64;
    while done < len {
        let pieces: Vec<(u64, usize)> = (0..IN_FLIGHT)
            .map(|i| done + (i * PIECE) as u64)
            .take_while(|&p| p < len)
            .map(|p| (a.offset + p, (len - p).min(PIECE as u64) as usize))
            .collect();
        let results: Vec<std::sync::Mutex<Vec<u8>>> =
            pieces.iter().map(|_| Default::default()).collect();
        let idx: Vec<usize> = (0..pieces.len()).collect();
        parallel(&idx, |&i| {
            let (off, n) = pieces[i];
            let v = obj.fetch_array(dkey, akey, off, n).map_err(client_err)?;
            *results[i].lock().unwrap_or_else(|p| p.into_inner()) = v;
            Ok(())
        })
        .context(what.clone())?;
        for r in results {
            let v = r.into_inner().unwrap_or_else(|p| p.into_inner());
            done += v.len() as u64;
            match file.as_mut() {
                Some(f) => f.write_all(&v),
                None => o.write_all(&v),
            }
            .with_context(|| format!("{what}: writing the value"))?;
        }
    }
    if let (true, Some(p)) = (json, &a.out) {
        writeln!(
            o,
            "{}",
            json!({"bytes": done, "out": p.display().to_string()})
        )?;
    }
    Ok(())
}

fn emit(
    v: &[u8],
    file: Option<&mut File>,
    json: bool,
    o: &mut impl Write,
    out: &Option<std::path::PathBuf>,
) -> Result<()> {
    match (file, json) {
        (Some(f), _) => {
            f.write_all(v).context("writing the value")?;
            if json {
                let p = out.as_ref().map(|p| p.display().to_string());
                writeln!(o, "{}", json!({"bytes": v.len(), "out": p}))?;
            }
        }
        (None, true) => writeln!(o, "{}", json!({"bytes": v.len(), "value": key_json(v)}))?,
        (None, false) => o.write_all(v)?,
    }
    Ok(())
}

/// Keys and values in JSON: text when they are UTF-8, else `{"hex": "..."}`.
fn key_json(k: &[u8]) -> Value {
    match std::str::from_utf8(k) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => json!({"hex": k.iter().map(|b| format!("{b:02x}")).collect::<String>()}),
    }
}

fn ls(svc: &Service, a: ObjLsArgs, json: bool, o: &mut impl Write) -> Result<()> {
    let oid = format_oid(&a.target.oid);
    let what = match &a.dkey {
        Some(d) => format!("obj ls {oid} {d:?}"),
        None => format!("obj ls {oid}"),
    };
    let client = connect(svc)?;
    let obj = open(&client, &a.target).context(what.clone())?;
    let keys = match &a.dkey {
        Some(d) => obj.list_akeys(d.as_bytes()),
        None => obj.list_dkeys(),
    }
    .map_err(client_err)
    .context(what)?;
    if json {
        let field = if a.dkey.is_some() { "akeys" } else { "dkeys" };
        let v = json!({"oid": oid, field: keys.iter().map(|k| key_json(k)).collect::<Vec<_>>()});
        writeln!(o, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    for k in keys {
        match std::str::from_utf8(&k) {
            Ok(s) if !s.chars().any(char::is_control) => writeln!(o, "{s}")?,
            _ => writeln!(o, "{}", peregrine::error::fmt_key(&k))?,
        }
    }
    Ok(())
}
