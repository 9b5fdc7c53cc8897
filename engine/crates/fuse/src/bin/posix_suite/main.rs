//! `peregrine-posix-suite`: POSIX checks in a directory of a mounted file
//! system, through libc (open, read, write, pread(64), pwrite(64), readv,
//! writev, preadv(64), pwritev(64), preadv2, pwritev2, lseek(64), fsync,
//! fdatasync, ftruncate(64), fstat, dup, dup2, dup3, fcntl F_DUPFD, fopen,
//! fread, fwrite, mmap(64) mixed with writes, ... and the metadata calls,
//! FIFOs, unix sockets and device nodes, link counts, hard links), with the
//! error codes.
//!
//! ```text
//! peregrine-posix-suite DIR [--ro RO_DIR] [--full FULL_DIR] [--entries N]
//! ```
//! * `DIR`: an empty directory of the mount under test.
//! * `--ro RO_DIR`: `DIR` as seen through a read-only mount of the same
//!   container (EROFS checks; the suite writes `DIR/ro/*` first).
//! * `--full FULL_DIR`: a directory on a small pool; filled up to ENOSPC
//!   and emptied again.
//! * `--entries N`: files in the readdir directory (default 1000).
//!
//! Every check prints one line, `name: observed`, and the observations do
//! not depend on timing, descriptors or free space, so two runs (say
//! without and with `LD_PRELOAD=libperegrine_il.so`) can be compared line
//! by line. A check that does not see what POSIX (or Peregrine's documented
//! behaviour) wants prints `FAIL name: observed, want ...`; the exit status
//! is then 1. Data is checked against an in-memory model and shown as
//! length + FNV-1a hash.

const MIB: usize = 1 << 20;

mod attrs;
mod data;
mod hardlinks;
mod limits;
mod mmap;
mod names;
mod special;
mod sys;

use sys::*;

// ------------------------------------------------------------------ suite

struct Suite {
    base: PathBuf,
    checks: usize,
    fails: Vec<String>,
}

impl Suite {
    fn p(&self, rel: &str) -> CString {
        cs(&self.base.join(rel))
    }

    /// Print `name: got`; a FAIL line if it is not `want`.
    fn check<T: Debug + PartialEq>(&mut self, name: &str, got: T, want: T) {
        self.checks += 1;
        if got == want {
            println!("{name}: {got:?}");
        } else {
            let line = format!("FAIL {name}: {got:?}, want {want:?}");
            println!("{line}");
            self.fails.push(line);
        }
    }

    /// `check(name, cond, true)`, with `detail` shown on failure only.
    fn truth(&mut self, name: &str, cond: bool, detail: impl Debug) {
        self.checks += 1;
        if cond {
            println!("{name}: true");
        } else {
            let line = format!("FAIL {name}: false ({detail:?})");
            println!("{line}");
            self.fails.push(line);
        }
    }

    /// A step the rest of a section needs: abort the section's caller on
    /// failure by returning None (the failure is recorded).
    fn must<T: Debug>(&mut self, name: &str, r: R<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                let line = format!("FAIL {name}: {e:?} (setup step; section abandoned)");
                println!("{line}");
                self.fails.push(line);
                None
            }
        }
    }

    /// Whole-file check against the model (read through a new descriptor).
    fn file_is(&mut self, name: &str, rel: &str, model: &[u8]) {
        let p = self.p(rel);
        self.check(&format!("{name}: size"), size(&p), Ok(model.len() as i64));
        self.check(
            &format!("{name}: content"),
            read_file(&p).map(|b| fp(&b)),
            Ok(fp(model)),
        );
    }

    // ------------------------------------------------------------ data
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let mut ro = None;
    let mut full = None;
    let mut entries = 1000usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--ro" => ro = args.next().map(PathBuf::from),
            "--full" => full = args.next().map(PathBuf::from),
            "--entries" => {
                entries = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage("--entries N"))
            }
            "-h" | "--help" => usage(""),
            _ if dir.is_none() && !a.starts_with('-') => dir = Some(PathBuf::from(a)),
            _ => usage(&format!("unexpected argument {a:?}")),
        }
    }
    let Some(dir) = dir else {
        usage("no directory")
    };
    match std::fs::read_dir(&dir) {
        Ok(mut d) => {
            if d.next().is_some() {
                usage(&format!("{} is not empty", dir.display()));
            }
        }
        Err(e) => usage(&format!("{}: {e}", dir.display())),
    }
    // SAFETY: umask takes and returns only a mode.
    unsafe { libc::umask(0o022) };
    let mut s = Suite {
        base: dir,
        checks: 0,
        fails: Vec::new(),
    };
    s.data_calls();
    s.vectored();
    s.seeks();
    s.ftruncate();
    s.append();
    s.dups();
    s.access_modes();
    s.stdio();
    s.opens();
    s.unlinked_open_file();
    s.mmap();
    s.errors();
    s.renames();
    s.symlinks();
    s.attrs();
    s.truncate_fallocate();
    s.statfs();
    s.xattrs();
    s.hard_links();
    s.special_files();
    s.link_counts();
    s.readdir(entries);
    s.dir_times();
    match &ro {
        Some(r) => s.read_only(r),
        None => println!("read-only: skipped (no --ro)"),
    }
    match &full {
        Some(f) => s.enospc(f),
        None => println!("ENOSPC: skipped (no --full)"),
    }
    s.tree_link_counts();
    eprintln!(
        "peregrine-posix-suite: {} checks, {} failed",
        s.checks,
        s.fails.len()
    );
    for f in &s.fails {
        eprintln!("  {f}");
    }
    std::process::exit(if s.fails.is_empty() { 0 } else { 1 });
}

fn usage(msg: &str) -> ! {
    if !msg.is_empty() {
        eprintln!("peregrine-posix-suite: {msg}");
    }
    eprintln!(
        "usage: peregrine-posix-suite DIR [--ro RO_DIR] [--full FULL_DIR] [--entries N]\n\
         DIR: an empty directory in the mount under test; RO_DIR: DIR through a\n\
         read-only mount of the same container; FULL_DIR: a directory on a small pool"
    );
    std::process::exit(2);
}
