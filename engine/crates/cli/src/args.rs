//! The command line, as clap derive types.

use crate::parse::{
    parse_oclass, parse_oid, parse_prop, parse_ranks, parse_ratio, parse_secs, parse_size, Prop,
    Ranks, Size,
};
use clap::{Args, Parser, Subcommand, ValueEnum};
use peregrine_proto::oclass::ObjectId;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "peregrine",
    version,
    about = "Administer a Peregrine system: engines, storage, pools, containers, objects",
    propagate_version = true
)]
pub struct Cli {
    /// Management service address (HOST:PORT; the port defaults to 10001).
    #[arg(
        long,
        global = true,
        env = "PEREGRINE_MGMT",
        default_value = "127.0.0.1:10001",
        value_name = "ADDR"
    )]
    pub mgmt: String,

    /// The control plane's certificate directory (ca.crt, tls.crt, tls.key; an
    /// admin certificate for admin commands, see `peregrine certs`).
    #[arg(long, global = true, env = "PEREGRINE_TLS_DIR", value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,

    /// Talk to engines started with allow_insecure: true (no TLS); env PEREGRINE_INSECURE=1.
    #[arg(long, global = true)]
    pub insecure: bool,

    /// Print machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// Seconds to wait for the connection and for each request.
    #[arg(long, global = true, value_name = "SECS", default_value = "60", value_parser = parse_secs)]
    pub timeout: Duration,

    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Engines and the system map.
    #[command(subcommand)]
    System(SystemCmd),
    /// Storage devices of every engine.
    #[command(subcommand)]
    Storage(StorageCmd),
    /// Pools: space reservations over the engines' targets.
    #[command(subcommand)]
    Pool(PoolCmd),
    /// Containers inside a pool, and their snapshots.
    #[command(subcommand)]
    Cont(ContCmd),
    /// Objects: put, get and list keys and values.
    #[command(subcommand)]
    Obj(ObjCmd),
    /// Make a CA and certificates for a local system (docs/tls.md); no engine is contacted.
    Certs(CertsArgs),
}

/// `peregrine certs`: OUT/ca/{ca.crt,ca.key} (an existing one is reused),
/// OUT/engine-<rank>/, OUT/admin/, OUT/client-<name>/ with ca.crt, tls.crt, tls.key.
#[derive(Args, Debug)]
pub struct CertsArgs {
    /// System name (the engines' `name`), written into every certificate.
    #[arg(long)]
    pub system: String,
    /// Directory to write into.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Engine certificates for ranks 0..N.
    #[arg(long, value_name = "N", default_value = "0")]
    pub ranks: u32,
    /// An admin certificate (the CLI, the operator).
    #[arg(long)]
    pub admin: bool,
    /// Client certificates (FUSE daemons, library users) of these names.
    #[arg(long, value_name = "NAME", num_args = 1..)]
    pub client: Vec<String>,
    /// More DNS names or IPs for the engine certificates (besides peregrine-engine).
    #[arg(long, value_name = "HOST")]
    pub host: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum SystemCmd {
    /// Show the system map: every engine's rank, state and addresses.
    Query,
}

#[derive(Subcommand, Debug)]
pub enum StorageCmd {
    /// Show every joined engine's devices, whether they are formatted, and how many
    /// acknowledged WAL records wait for a flush of the device's write cache.
    Scan,
    /// Format the storage of every joined engine, after which they serve I/O.
    Format {
        /// Format even devices that carry another system's signature (destroys their data).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum PoolCmd {
    /// Create a pool.
    Create(PoolCreateArgs),
    /// List pools.
    List,
    /// Show a pool's state, space and properties.
    Query {
        /// Pool label or UUID.
        id: String,
    },
    /// Destroy a pool.
    Destroy {
        /// Pool label or UUID.
        id: String,
        /// Destroy even if it still holds containers.
        #[arg(long)]
        force: bool,
    },
    /// Set pool properties.
    SetProp {
        /// Pool label or UUID.
        id: String,
        /// Properties as KEY=VALUE.
        #[arg(required = true, value_parser = parse_prop, value_name = "KEY=VALUE")]
        props: Vec<Prop>,
    },
}

#[derive(Args, Debug)]
pub struct PoolCreateArgs {
    /// Pool label.
    pub label: String,
    /// Total size, split between tiers by --tier-ratio.
    #[arg(long, value_parser = parse_size, conflicts_with_all = ["scm_size", "nvme_size"],
          required_unless_present_all = ["scm_size", "nvme_size"])]
    pub size: Option<Size>,
    /// Fraction of --size that goes to the SCM (metadata) tier; the service defaults to 0.06.
    #[arg(long, value_parser = parse_ratio, requires = "size", value_name = "F")]
    pub tier_ratio: Option<f64>,
    /// SCM (metadata) tier size.
    #[arg(long, value_parser = parse_size, requires = "nvme_size", value_name = "SIZE")]
    pub scm_size: Option<Size>,
    /// NVMe (bulk data) tier size.
    #[arg(long, value_parser = parse_size, requires = "scm_size", value_name = "SIZE")]
    pub nvme_size: Option<Size>,
    /// Ranks to place the pool on, e.g. 0,1,2 or 0-2 (default: all joined ranks).
    #[arg(long, value_parser = parse_ranks, value_name = "RANKS")]
    pub ranks: Option<Ranks>,
    /// Pool property KEY=VALUE (repeatable).
    #[arg(long = "prop", value_parser = parse_prop, value_name = "KEY=VALUE")]
    pub props: Vec<Prop>,
}

#[derive(Subcommand, Debug)]
pub enum ContCmd {
    /// Create a container.
    Create(ContCreateArgs),
    /// List the containers of a pool.
    List {
        /// Pool label or UUID.
        pool: String,
    },
    /// Show a container's properties and usage.
    Query {
        /// Pool label or UUID.
        pool: String,
        /// Container label or UUID.
        cont: String,
    },
    /// Destroy a container.
    Destroy {
        /// Pool label or UUID.
        pool: String,
        /// Container label or UUID.
        cont: String,
        /// Destroy even if it is open or has snapshots.
        #[arg(long)]
        force: bool,
    },
    /// Set container properties.
    SetProp {
        /// Pool label or UUID.
        pool: String,
        /// Container label or UUID.
        cont: String,
        /// Properties as KEY=VALUE.
        #[arg(required = true, value_parser = parse_prop, value_name = "KEY=VALUE")]
        props: Vec<Prop>,
    },
    /// Snapshots: create, list, destroy.
    #[command(subcommand)]
    Snap(SnapCmd),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Checksum {
    Crc32c,
    Off,
}

impl Checksum {
    pub fn name(self) -> &'static str {
        match self {
            Checksum::Crc32c => "crc32c",
            Checksum::Off => "off",
        }
    }
}

#[derive(Args, Debug)]
pub struct ContCreateArgs {
    /// Pool label or UUID.
    pub pool: String,
    /// Container label.
    pub label: String,
    /// Container type.
    #[arg(long = "type", default_value = "POSIX", value_name = "TYPE")]
    pub cont_type: String,
    /// Default object class for files (e.g. SX, S1, RP_2G1, EC_2P1G1).
    #[arg(long, value_parser = parse_oclass, value_name = "CLASS")]
    pub oclass: Option<String>,
    /// Default object class for directories.
    #[arg(long, value_parser = parse_oclass, value_name = "CLASS")]
    pub dir_oclass: Option<String>,
    /// Chunk size of files (the service defaults to 1 MiB).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub chunk_size: Option<Size>,
    /// Redundancy factor: engine failures the container must survive.
    #[arg(long, value_name = "N")]
    pub rf: Option<u32>,
    /// End-to-end checksums.
    #[arg(long, value_enum)]
    pub checksum: Option<Checksum>,
    /// Container property KEY=VALUE (repeatable).
    #[arg(long = "prop", value_parser = parse_prop, value_name = "KEY=VALUE")]
    pub props: Vec<Prop>,
    /// Make a clone: what this container (of the same pool) held at the
    /// snapshot --clone-epoch; properties not given are its.
    #[arg(long, value_name = "CONT", requires = "clone_epoch")]
    pub clone_from: Option<String>,
    /// The epoch of the snapshot to clone (see `cont snap list`).
    #[arg(long, value_name = "EPOCH", requires = "clone_from")]
    pub clone_epoch: Option<u64>,
}

#[derive(Subcommand, Debug)]
pub enum SnapCmd {
    /// Take a snapshot of the container's latest epoch.
    Create {
        pool: String,
        cont: String,
        /// Name of the snapshot.
        #[arg(long)]
        name: Option<String>,
    },
    /// List snapshots.
    List { pool: String, cont: String },
    /// Destroy a snapshot, named by epoch or name.
    Destroy {
        pool: String,
        cont: String,
        #[arg(
            long,
            conflicts_with = "name",
            required_unless_present = "name",
            value_name = "E"
        )]
        epoch: Option<u64>,
        #[arg(long, value_name = "N")]
        name: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ObjCmd {
    /// Store a value under OID / DKEY / AKEY.
    Put(ObjPutArgs),
    /// Fetch a value (to stdout unless --out).
    Get(ObjGetArgs),
    /// List the dkeys of an object, or the akeys of one dkey.
    Ls(ObjLsArgs),
}

/// Where an object lives; OID as `CLASS:HI.LO` (e.g. `SX:1.2`, `RP_2G1:0x10.0x1`).
#[derive(Args, Debug)]
pub struct ObjTarget {
    /// Pool label or UUID.
    pub pool: String,
    /// Container label or UUID.
    pub cont: String,
    /// Object id as CLASS:HI.LO, e.g. SX:1.2 (decimal, or hex with 0x).
    #[arg(value_parser = parse_oid)]
    pub oid: ObjectId,
}

#[derive(Args, Debug)]
pub struct ObjPutArgs {
    #[command(flatten)]
    pub target: ObjTarget,
    pub dkey: String,
    pub akey: String,
    /// The value, as text.
    #[arg(
        long,
        conflicts_with = "file",
        required_unless_present = "file",
        value_name = "STR"
    )]
    pub value: Option<String>,
    /// Read the value from a file.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Write into an array value (extents) rather than replace a single value.
    #[arg(long)]
    pub array: bool,
    /// Byte offset in the array.
    #[arg(long, requires = "array", default_value_t = 0, value_name = "N")]
    pub offset: u64,
}

#[derive(Args, Debug)]
pub struct ObjGetArgs {
    #[command(flatten)]
    pub target: ObjTarget,
    pub dkey: String,
    pub akey: String,
    /// Read from an array value.
    #[arg(long)]
    pub array: bool,
    /// Byte offset in the array.
    #[arg(long, requires = "array", default_value_t = 0, value_name = "N")]
    pub offset: u64,
    /// Bytes to read (default: up to the array's size).
    #[arg(long, requires = "array", value_parser = parse_size, value_name = "N")]
    pub len: Option<Size>,
    /// Write the value to a file instead of stdout.
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ObjLsArgs {
    #[command(flatten)]
    pub target: ObjTarget,
    /// List the akeys of this dkey instead of the object's dkeys.
    pub dkey: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn pool_create_forms() {
        let ok = |args: &[&str]| {
            Cli::try_parse_from(args)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(ok(&["peregrine", "pool", "create", "tank", "--size", "1GiB"]).is_ok());
        assert!(ok(&[
            "peregrine",
            "pool",
            "create",
            "t",
            "--scm-size",
            "1G",
            "--nvme-size",
            "8G"
        ])
        .is_ok());
        assert!(
            ok(&["peregrine", "pool", "create", "t"]).is_err(),
            "a size is required"
        );
        assert!(ok(&["peregrine", "pool", "create", "t", "--scm-size", "1G"]).is_err());
        assert!(ok(&[
            "peregrine",
            "pool",
            "create",
            "t",
            "--size",
            "1G",
            "--nvme-size",
            "8G"
        ])
        .is_err());
        let e = ok(&["peregrine", "pool", "create", "t", "--size", "12XB"]).unwrap_err();
        assert!(e.contains("--size") && e.contains("12XB"), "{e}");
    }
}
