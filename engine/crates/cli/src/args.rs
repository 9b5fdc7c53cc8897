//! The command line, as clap derive types.

use crate::acl::{parse_entries, parse_owner, parse_principal};
use crate::parse::{
    parse_oclass, parse_oid, parse_prop, parse_ranks, parse_ratio, parse_secs, parse_size, Prop,
    Ranks, Size,
};
use clap::{Args, Parser, Subcommand, ValueEnum};
use peregrine_proto::acl::{Acl, Principal};
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

    /// Object commands through the node agent at this socket (`peregrine-agent`), for a
    /// user without a certificate: the agent names the caller by its uid to the ACLs.
    /// Management commands ignore it.
    #[arg(
        long,
        global = true,
        env = "PEREGRINE_AGENT_SOCKET",
        value_name = "SOCKET"
    )]
    pub agent: Option<PathBuf>,

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
    /// Show the pool's owner, owner group and ACL (one entry a line).
    GetAcl {
        /// Pool label or UUID.
        id: String,
    },
    /// Add ACL entries, replacing those of the same principals; print the new ACL.
    UpdateAcl {
        /// Pool label or UUID.
        id: String,
        #[command(flatten)]
        entries: AclEntries,
    },
    /// Remove the ACL entry of one principal; print the new ACL.
    DeleteAcl {
        /// Pool label or UUID.
        id: String,
        #[command(flatten)]
        principal: AclPrincipal,
    },
    /// Set the pool's owner user and/or owner group (whom OWNER@ and GROUP@ stand for).
    SetOwner {
        /// Pool label or UUID.
        id: String,
        #[command(flatten)]
        owner: OwnerArgs,
    },
    /// End open handles of the pool: one, or all of them (clients must connect
    /// and open again, and are checked against the ACLs again).
    Evict {
        /// Pool label or UUID.
        id: String,
        /// The handle to end (its UUID); without it, every handle of the pool.
        #[arg(long, value_name = "UUID", value_parser = parse_handle)]
        handle: Option<uuid::Uuid>,
    },
}

/// `update-acl`: the entries to add, on the command line or from a file.
#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub struct AclEntries {
    /// An entry A:<flags>:<principal>:<perms>, e.g. A::alice@:rw or A:G:staff@:r
    /// (repeatable; commas may separate several).
    #[arg(long = "entry", value_name = "ACE", value_parser = parse_entries)]
    pub entry: Vec<Acl>,
    /// A file of entries: one a line, `#` comments (what get-acl prints).
    #[arg(long, value_name = "FILE")]
    pub acl_file: Option<PathBuf>,
}

/// `delete-acl`: whose entry to remove.
#[derive(Args, Debug)]
pub struct AclPrincipal {
    /// OWNER@, GROUP@, EVERYONE@, u:NAME@ (a user) or g:NAME@ (a group).
    #[arg(long, value_name = "PRINCIPAL", value_parser = parse_principal)]
    pub principal: Principal,
}

/// `set-owner`: the new owner user, owner group, or both.
#[derive(Args, Debug)]
#[group(required = true, multiple = true)]
pub struct OwnerArgs {
    /// The owner user: NAME@ or a decimal uid (the property `owner`).
    #[arg(long, visible_alias = "owner", value_name = "NAME@", value_parser = parse_owner)]
    pub user: Option<String>,
    /// The owner group: NAME@ or a decimal gid (the property `group`).
    #[arg(long, value_name = "NAME@", value_parser = parse_owner)]
    pub group: Option<String>,
}

fn parse_handle(s: &str) -> Result<uuid::Uuid, String> {
    uuid::Uuid::parse_str(s.trim()).map_err(|e| format!("not a UUID: {e}"))
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
    /// Show the container's owner, owner group and ACL (one entry a line).
    GetAcl {
        /// Pool label or UUID.
        pool: String,
        /// Container label or UUID.
        cont: String,
    },
    /// Add ACL entries, replacing those of the same principals; print the new ACL.
    UpdateAcl {
        /// Pool label or UUID.
        pool: String,
        /// Container label or UUID.
        cont: String,
        #[command(flatten)]
        entries: AclEntries,
    },
    /// Remove the ACL entry of one principal; print the new ACL.
    DeleteAcl {
        /// Pool label or UUID.
        pool: String,
        /// Container label or UUID.
        cont: String,
        #[command(flatten)]
        principal: AclPrincipal,
    },
    /// Set the container's owner user and/or owner group (whom OWNER@ and GROUP@ stand for).
    SetOwner {
        /// Pool label or UUID.
        pool: String,
        /// Container label or UUID.
        cont: String,
        #[command(flatten)]
        owner: OwnerArgs,
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

    fn parse(args: &[&str]) -> Result<Command, String> {
        let mut v = vec!["peregrine"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v)
            .map(|c| c.cmd)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn acl_commands() {
        assert!(matches!(
            parse(&["pool", "get-acl", "tank"]),
            Ok(Command::Pool(PoolCmd::GetAcl { id })) if id == "tank"
        ));
        assert!(matches!(
            parse(&["cont", "get-acl", "tank", "c"]),
            Ok(Command::Cont(ContCmd::GetAcl { pool, cont })) if pool == "tank" && cont == "c"
        ));
        // Repeated --entry, each may hold several entries.
        let Ok(Command::Pool(PoolCmd::UpdateAcl { entries, .. })) = parse(&[
            "pool",
            "update-acl",
            "tank",
            "--entry",
            "A::alice@:rw",
            "--entry",
            "A:G:staff@:r,A::EVERYONE@:r",
        ]) else {
            panic!("update-acl with entries")
        };
        assert_eq!(entries.entry.len(), 2);
        assert_eq!(entries.entry[1].entries().len(), 2);
        assert!(entries.acl_file.is_none());
        let Ok(Command::Cont(ContCmd::UpdateAcl { entries, .. })) =
            parse(&["cont", "update-acl", "p", "c", "--acl-file", "/tmp/x"])
        else {
            panic!("update-acl with a file")
        };
        assert_eq!(entries.acl_file, Some(PathBuf::from("/tmp/x")));
        // One source, and one is needed.
        assert!(parse(&["pool", "update-acl", "tank"]).is_err());
        assert!(parse(&[
            "pool",
            "update-acl",
            "tank",
            "--entry",
            "A::a@:r",
            "--acl-file",
            "f"
        ])
        .is_err());
        // A bad entry is named.
        let e = parse(&["pool", "update-acl", "tank", "--entry", "A::bob@:rz"]).unwrap_err();
        assert!(e.contains("A::bob@:rz") && e.contains("permission"), "{e}");

        let Ok(Command::Cont(ContCmd::DeleteAcl { principal, .. })) =
            parse(&["cont", "delete-acl", "p", "c", "--principal", "g:staff@"])
        else {
            panic!("delete-acl")
        };
        assert_eq!(principal.principal, Principal::Group("staff".into()));
        assert!(parse(&["pool", "delete-acl", "tank"]).is_err());
        assert!(parse(&["pool", "delete-acl", "tank", "--principal", "bob"]).is_err());

        let Ok(Command::Pool(PoolCmd::SetOwner { owner, .. })) =
            parse(&["pool", "set-owner", "tank", "--owner", "ann@"])
        else {
            panic!("set-owner")
        };
        assert_eq!((owner.user.as_deref(), owner.group), (Some("ann"), None));
        let Ok(Command::Cont(ContCmd::SetOwner { owner, .. })) = parse(&[
            "cont",
            "set-owner",
            "p",
            "c",
            "--user",
            "ann@",
            "--group",
            "staff@",
        ]) else {
            panic!("set-owner of a container")
        };
        assert_eq!(owner.group.as_deref(), Some("staff"));
        assert!(parse(&["pool", "set-owner", "tank"]).is_err());
        assert!(parse(&["pool", "set-owner", "tank", "--group", "st aff@"]).is_err());
    }

    #[test]
    fn evict_forms() {
        let u = "0b7f6a43-9c1e-4c52-8d0e-5f2a1b3c4d5e";
        let Ok(Command::Pool(PoolCmd::Evict { id, handle })) =
            parse(&["pool", "evict", "tank", "--handle", u])
        else {
            panic!("evict one")
        };
        assert_eq!(
            (id.as_str(), handle.unwrap().to_string()),
            ("tank", u.into())
        );
        assert!(matches!(
            parse(&["pool", "evict", "tank"]),
            Ok(Command::Pool(PoolCmd::Evict { handle: None, .. }))
        ));
        let e = parse(&["pool", "evict", "tank", "--handle", "nope"]).unwrap_err();
        assert!(e.contains("UUID"), "{e}");
    }
}
