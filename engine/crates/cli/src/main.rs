//! `peregrine`: the administration command of a Peregrine system (like DAOS's
//! dmg and daos in one): system, storage, pool, container and object commands.
//!
//! Every failure ends as ONE line on stderr, `peregrine: <what failed>: <reason>`,
//! and exit code 1; usage errors exit 2 as clap's do. Scripts depend on both.

mod acl;
mod args;
mod mgmt;
mod obj;
mod output;
mod parse;

use args::{Cli, Command};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`peregrine pool list | head`) as other Unix
    // tools do, instead of failing a write half-way through a table.
    // SAFETY: setting a signal disposition to SIG_DFL before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // A bug must still end in the one-line form scripts parse, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("peregrine: internal error{at}: {}", one_line(&msg));
        std::process::exit(1);
    }));

    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => return clap_error(e),
    };
    if let Command::Certs(a) = &cli.cmd {
        return finish(certs(a, cli.json));
    }
    // The client library is synchronous and runs its own threads, so object
    // commands stay off the tokio runtime the management calls use.
    if let Command::Obj(cmd) = cli.cmd {
        let stdout = std::io::stdout();
        let mut o = stdout.lock();
        let run = |svc: &obj::Service| obj::run(svc, cli.timeout, cmd, cli.json, &mut o);
        // Through the node agent, they need no certificate of their own.
        let r = match &cli.agent {
            Some(socket) => run(&obj::Service::Agent(socket)),
            None => security(&cli.tls_dir, cli.insecure).and_then(|security| {
                run(&obj::Service::Mgmt {
                    addr: &cli.mgmt,
                    security: &security,
                })
            }),
        };
        return finish(r.and_then(|()| Ok(o.flush()?)));
    }
    let security = match security(&cli.tls_dir, cli.insecure) {
        Ok(s) => s,
        Err(e) => return finish(Err(e)),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("peregrine: cannot start runtime: {e}");
            return ExitCode::from(1);
        }
    };
    finish(rt.block_on(run(cli, security)))
}

/// `--tls-dir` (or PEREGRINE_TLS_DIR) or `--insecure` (or PEREGRINE_INSECURE=1):
/// exactly one; the environment's insecure only when no directory is given.
fn security(tls_dir: &Option<PathBuf>, insecure: bool) -> anyhow::Result<peregrine::Security> {
    let insecure = insecure || (tls_dir.is_none() && peregrine::tls::env_insecure());
    peregrine::Security::from_flags(tls_dir.clone(), insecure).map_err(|e| anyhow::anyhow!(e))
}

fn finish(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("peregrine: {}", one_line(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli, security: peregrine::Security) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut o = stdout.lock();
    let json = cli.json;
    let mut m = mgmt::Mgmt::connect(&cli.mgmt, &security, cli.timeout).await?;
    match cli.cmd {
        Command::System(c) => mgmt::system(&mut m, c, json, &mut o).await?,
        Command::Storage(c) => mgmt::storage(&mut m, c, json, &mut o).await?,
        Command::Pool(c) => mgmt::pool(&mut m, c, json, &mut o).await?,
        Command::Cont(c) => mgmt::cont(&mut m, c, json, &mut o).await?,
        Command::Obj(_) | Command::Certs(_) => {
            unreachable!("object and certs commands run before the runtime starts")
        }
    }
    o.flush()?;
    Ok(())
}

/// `peregrine certs`: print the directories written.
fn certs(a: &args::CertsArgs, json: bool) -> anyhow::Result<()> {
    let plan = peregrine::certs::Plan {
        system: a.system.clone(),
        ranks: a.ranks,
        admin: a.admin,
        clients: a.client.clone(),
        hosts: a.host.clone(),
    };
    let dirs =
        peregrine::certs::generate(&a.out, &plan).map_err(|e| anyhow::anyhow!("certs: {e}"))?;
    let stdout = std::io::stdout();
    let mut o = stdout.lock();
    if json {
        let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        writeln!(
            o,
            "{}",
            serde_json::json!({ "system": a.system, "dirs": dirs })
        )?;
    } else {
        for d in dirs {
            writeln!(o, "{}", d.display())?;
        }
    }
    Ok(())
}

/// Messages from the service or the OS may hold newlines; the contract is one line.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A bad value for a flag is reported in the one-line form naming the flag
/// (`peregrine: --size "12XB": unknown unit ...`); other usage errors, help and
/// version keep clap's own output. Either way clap's exit code (2 for usage).
fn clap_error(e: clap::Error) -> ExitCode {
    if e.kind() == ErrorKind::ValueValidation {
        let arg = match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(s)) => s.split_whitespace().next().unwrap_or(s).to_string(),
            _ => String::new(),
        };
        let value = match e.get(ContextKind::InvalidValue) {
            Some(ContextValue::String(s)) => s.clone(),
            _ => String::new(),
        };
        let reason = std::error::Error::source(&e)
            .map(|s| s.to_string())
            .unwrap_or_else(|| e.kind().to_string());
        // Positional arguments render as `<OID>`; show them as the name alone.
        let arg = arg.trim_start_matches('<').trim_end_matches('>');
        eprintln!("peregrine: {arg} {value:?}: {}", one_line(&reason));
        return ExitCode::from(2);
    }
    let code = e.exit_code();
    let _ = e.print();
    ExitCode::from(code as u8)
}
