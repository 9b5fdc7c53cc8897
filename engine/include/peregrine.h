/*
 * peregrine.h - C API of the Peregrine client library (libperegrine.so).
 *
 * Conventions
 *   - Every function returns 0 on success (or a count where documented) and
 *     a negative errno on failure: -ENOENT (no such pool/container/value),
 *     -EINVAL (bad argument, unknown object class), -ERANGE (buffer too
 *     small), -EILSEQ (checksum mismatch: no intact copy of the data),
 *     -EHOSTDOWN / -ECONNREFUSED / -ETIMEDOUT (engines unreachable), -EROFS
 *     (write through a snapshot handle), -EIO (anything else, including an
 *     internal error). prg_strerror() gives a short text for a code and
 *     prg_last_error() the detailed message of this thread's last failure
 *     (which pool, rank, address, object and dkey).
 *   - Handles are opaque. Closing a parent before its children is allowed
 *     (children keep what they need alive); each handle is closed once.
 *   - All calls are thread-safe and blocking, except the *_async ones,
 *     which complete through an event queue.
 *   - Keys are byte strings (pointer + length); dkeys and akeys must not be
 *     empty. A dkey selects placement; under it, an akey names either a
 *     SINGLE value (replaced as a whole) or an ARRAY of bytes.
 *
 * Link with -lperegrine.
 */
#ifndef PEREGRINE_H
#define PEREGRINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Epoch meaning "the latest version" (for prg_obj_open_at). */
#define PRG_EPOCH_LATEST UINT64_MAX

typedef struct PrgClient prg_client_t; /**< connection to a system */
typedef struct PrgPool prg_pool_t;     /**< connected pool */
typedef struct PrgCont prg_cont_t;     /**< open container */
typedef struct PrgObj prg_obj_t;       /**< open object */
typedef struct PrgEq prg_eq_t;         /**< event queue for async I/O */

/** 128-bit object id; the top 8 bits of hi carry the object class. */
typedef struct {
	uint64_t hi;
	uint64_t lo;
} prg_obj_id_t;

/** A completed asynchronous operation. */
typedef struct {
	void *user_tag;    /**< the tag given when the operation was started */
	int32_t rc;        /**< 0 or a negative errno */
	uint32_t reserved;
} prg_event_t;

/**
 * Key callback of the list functions; called once per key, in key order.
 * Returning non-zero stops the listing, and the list function returns
 * that value.
 */
typedef int (*prg_key_cb)(const void *key, size_t len, void *arg);

/* ---- connection, pools, containers ---- */

/**
 * Connect to the management service at "host:port" (default port 10001).
 * The control plane's security comes from the environment, read at the
 * first connect of the process (docs/tls.md): PEREGRINE_TLS_DIR, a
 * directory with ca.crt, tls.crt and tls.key, or PEREGRINE_INSECURE=1 for
 * engines started with allow_insecure; neither fails with -EINVAL. A
 * process without a certificate sets PEREGRINE_AGENT_SOCKET instead: its
 * pool connects and container opens then go through the node's
 * peregrine-agent, which names its user to the ACLs (docs/access-control.md;
 * mgmt_addr is then not used).
 */
int prg_connect(const char *mgmt_addr, prg_client_t **client);
int prg_disconnect(prg_client_t *client);

/** Connect to a pool named by label or UUID string (fetches its map). */
int prg_pool_connect(prg_client_t *client, const char *pool, prg_pool_t **out);
int prg_pool_disconnect(prg_pool_t *pool);
/** Copy the pool's 16-byte UUID into uuid. */
int prg_pool_uuid(prg_pool_t *pool, unsigned char uuid[16]);

/** Open a container named by label or UUID string. */
int prg_cont_open(prg_pool_t *pool, const char *cont, prg_cont_t **out);
int prg_cont_close(prg_cont_t *cont);
/** Copy the container's 16-byte UUID into uuid. */
int prg_cont_uuid(prg_cont_t *cont, unsigned char uuid[16]);
/** Create a snapshot (name may be NULL); its epoch goes to *epoch if not NULL. */
int prg_cont_snapshot(prg_cont_t *cont, const char *name, uint64_t *epoch);

/* ---- objects ---- */

/**
 * Build an object id of class oclass ("S1", "S2", "S4", "SX", "RP_2G1",
 * "RP_3G1", "RP_2GX", "EC_2P1G1", "EC_4P2G1", "EC_2P1GX"; case-insensitive)
 * from a caller-chosen 120-bit number (top 8 bits of hi are replaced).
 * Unknown class: -EINVAL.
 */
int prg_obj_id_make(const char *oclass, uint64_t hi, uint64_t lo, prg_obj_id_t *oid);

/** Open an object for reading and writing at the latest epoch. */
int prg_obj_open(prg_cont_t *cont, prg_obj_id_t oid, prg_obj_t **out);
/** Open an object read-only at epoch (e.g. a snapshot's); writes give -EROFS. */
int prg_obj_open_at(prg_cont_t *cont, prg_obj_id_t oid, uint64_t epoch, prg_obj_t **out);
int prg_obj_close(prg_obj_t *obj);

/** Replace the SINGLE value akey of dkey with len bytes of buf. */
int prg_obj_update_single(prg_obj_t *obj, const void *dkey, size_t dkey_len,
			  const void *akey, size_t akey_len, const void *buf, size_t len);

/**
 * Fetch the SINGLE value akey of dkey into buf. On entry *len_inout is the
 * capacity of buf; on return it is the value's size. A value larger than
 * the buffer gives -ERANGE (with the needed size in *len_inout); a value
 * that does not exist gives -ENOENT.
 */
int prg_obj_fetch_single(prg_obj_t *obj, const void *dkey, size_t dkey_len,
			 const void *akey, size_t akey_len, void *buf, size_t *len_inout);

/** Write len bytes of buf at byte offset of the ARRAY value akey of dkey. */
int prg_obj_update_array(prg_obj_t *obj, const void *dkey, size_t dkey_len,
			 const void *akey, size_t akey_len, uint64_t offset,
			 const void *buf, size_t len);

/** Read exactly len bytes at offset of ARRAY akey into buf; holes read as zeros. */
int prg_obj_fetch_array(prg_obj_t *obj, const void *dkey, size_t dkey_len,
			const void *akey, size_t akey_len, uint64_t offset,
			void *buf, size_t len);

/** Size of ARRAY akey (highest byte written + 1; 0 if absent) into *size. */
int prg_obj_array_size(prg_obj_t *obj, const void *dkey, size_t dkey_len,
		       const void *akey, size_t akey_len, uint64_t *size);

/**
 * Make every update and punch of the object acknowledged so far survive a
 * power cut, as fsync does. Updates are acknowledged once written to the
 * engines' devices (they survive the crash of any process); a container with
 * property sync=always flushes each one before acknowledging it.
 */
int prg_obj_flush(prg_obj_t *obj);

/** Punch (delete) the whole object. */
int prg_obj_punch(prg_obj_t *obj);
/** Punch one dkey and everything under it. */
int prg_obj_punch_dkey(prg_obj_t *obj, const void *dkey, size_t dkey_len);
/** Punch n akeys (akeys[i] of akey_lens[i] bytes) of dkey. */
int prg_obj_punch_akeys(prg_obj_t *obj, const void *dkey, size_t dkey_len,
			const void *const *akeys, const size_t *akey_lens, size_t n);

/** Call cb for every dkey of the object (sorted). */
int prg_obj_list_dkeys(prg_obj_t *obj, prg_key_cb cb, void *arg);
/** Call cb for every akey of dkey (sorted). */
int prg_obj_list_akeys(prg_obj_t *obj, const void *dkey, size_t dkey_len,
		       prg_key_cb cb, void *arg);

/* ---- asynchronous I/O ---- */

/** Create an event queue (it owns a few worker threads). */
int prg_eq_create(prg_eq_t **eq);
/** Destroy an event queue; -EBUSY while operations are in flight. */
int prg_eq_destroy(prg_eq_t *eq);

/**
 * Start prg_obj_update_array / prg_obj_fetch_array without waiting. Keys
 * are copied; buf must stay valid (and, for updates, unchanged) until the
 * operation's event has been returned by prg_eq_poll. Returns 0 if started
 * (the result comes in the event's rc) or a negative errno if not.
 */
int prg_obj_update_array_async(prg_obj_t *obj, const void *dkey, size_t dkey_len,
			       const void *akey, size_t akey_len, uint64_t offset,
			       const void *buf, size_t len, prg_eq_t *eq, void *user_tag);
int prg_obj_fetch_array_async(prg_obj_t *obj, const void *dkey, size_t dkey_len,
			      const void *akey, size_t akey_len, uint64_t offset,
			      void *buf, size_t len, prg_eq_t *eq, void *user_tag);

/**
 * Wait up to timeout_ms (0: do not wait, negative: wait forever) for
 * completed operations; store at most max of them in events. Returns the
 * number stored (0 on timeout) or a negative errno.
 */
int prg_eq_poll(prg_eq_t *eq, int max, int timeout_ms, prg_event_t *events);
/** Operations started on eq whose events have not been polled yet. */
int prg_eq_inflight(prg_eq_t *eq);

/* ---- errors ---- */

/** Short static text for a (negative or positive) errno. */
const char *prg_strerror(int rc);
/**
 * Detailed message of the calling thread's last failed call ("" if none);
 * valid until that thread's next failing call.
 */
const char *prg_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* PEREGRINE_H */
