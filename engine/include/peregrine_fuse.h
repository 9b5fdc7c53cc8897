/*
 * peregrine_fuse.h: the ioctl peregrine-fuse answers on an open regular file
 * of a Peregrine mount, handing an interception library (or any program)
 * what it needs to read and write the file's object directly through the
 * client library (peregrine.h), bypassing FUSE.
 *
 *   struct peregrine_fuse_handle h;
 *   if (ioctl(fd, PEREGRINE_IOC_GET_HANDLE, &h) == 0) { ... }
 *
 * On a directory the handle names the directory's object, with
 * PEREGRINE_FUSE_HANDLE_DIR set and chunk_size 0 (the container is what it
 * is for). ENOTTY: not a Peregrine file or directory. Fields are in host byte
 * order. File layout (peregrine-dfs, layout version 1): byte o of the file
 * is in dkey = chunk index o / chunk_size as 8 bytes big-endian, akey "d",
 * array offset o % chunk_size. The file size is the highest chunk dkey
 * holding data times chunk_size plus that chunk's array size (derive it
 * from the store; it is not stored). After writing behind the kernel's
 * back, stat the file through the mount to refresh the kernel's size.
 */
#ifndef PEREGRINE_FUSE_H
#define PEREGRINE_FUSE_H

#include <stdint.h>
#include <sys/ioctl.h>

#define PEREGRINE_FUSE_HANDLE_VERSION 1
#define PEREGRINE_FUSE_MGMT_MAX 128
/* flags */
#define PEREGRINE_FUSE_HANDLE_RDONLY 0x1u /* the mount is read-only */
#define PEREGRINE_FUSE_HANDLE_DIR 0x2u    /* a directory's handle */

struct peregrine_fuse_handle {
	uint32_t version;    /* PEREGRINE_FUSE_HANDLE_VERSION */
	uint32_t flags;      /* PEREGRINE_FUSE_HANDLE_* */
	uint8_t pool_uuid[16];
	uint8_t cont_uuid[16];
	uint64_t oid_hi;     /* object id; the class is the top byte of oid_hi */
	uint64_t oid_lo;
	uint64_t chunk_size; /* bytes per chunk dkey */
	uint64_t reserved[2];
	char mgmt_addr[PEREGRINE_FUSE_MGMT_MAX]; /* "host:port", NUL-terminated */
};                           /* 208 bytes */

#define PEREGRINE_IOC_GET_HANDLE _IOR('P', 1, struct peregrine_fuse_handle)

/*
 * After writing a file behind the kernel's back (through the handle above),
 * ioctl(fd, PEREGRINE_IOC_INVALIDATE) on an open descriptor of that file:
 * the daemon records the size from the store and a new mtime in the entry
 * and drops the kernel's cached attributes and pages of the inode, so stat
 * and reads through the mount (any process) see the new data.
 */
#define PEREGRINE_IOC_INVALIDATE _IO('P', 2)

/*
 * The pool map and the container's description, so that a program without
 * a control-plane certificate (the interception library in a workload pod)
 * can open the container without the control port (docs/tls.md): the
 * daemon asks the management service with its own certificate at each call.
 * On an open regular file of the mount. Set version and offset, call, take
 * len bytes of data; repeat at offset + len until total bytes are read. If
 * generation changes between calls, the description changed: start again.
 * The description: a uint32 n, n bytes of a protobuf PoolMap, then a
 * protobuf ContInfo (engine/proto/mgmt.proto). Host byte order.
 */
#define PEREGRINE_FUSE_CONT_VERSION 1
#define PEREGRINE_FUSE_CONT_CHUNK 16000

struct peregrine_fuse_cont {
	uint32_t version;    /* in: PEREGRINE_FUSE_CONT_VERSION */
	uint32_t offset;     /* in: first byte of the description wanted */
	uint32_t total;      /* out: bytes of the whole description */
	uint32_t len;        /* out: bytes of it in data */
	uint64_t generation; /* out: a hash of the whole description (FNV-1a 64) */
	uint8_t data[PEREGRINE_FUSE_CONT_CHUNK];
};                           /* 16024 bytes */

#define PEREGRINE_IOC_GET_CONT _IOWR('P', 3, struct peregrine_fuse_cont)

/*
 * After changing directories behind the kernel's back (creating, removing or
 * renaming entries in them through the client library), name them here, on
 * any open descriptor of the mount (a file or a directory, its root for
 * one): the daemon forgets the attributes it keeps of each and drops the
 * kernel's cached attributes of their inodes, so stat through the mount (any
 * process) sees the new link count and times. EINVAL: count past
 * PEREGRINE_FUSE_DIRS_MAX or reserved not 0.
 */
#define PEREGRINE_FUSE_DIRS_MAX 255

struct peregrine_fuse_dirs {
	uint32_t count;    /* directories in oid[] */
	uint32_t reserved; /* 0 */
	struct {
		uint64_t hi;
		uint64_t lo;
	} oid[PEREGRINE_FUSE_DIRS_MAX];
};                         /* 4088 bytes */

#define PEREGRINE_IOC_INVALIDATE_DIRS _IOW('P', 4, struct peregrine_fuse_dirs)

#endif /* PEREGRINE_FUSE_H */
