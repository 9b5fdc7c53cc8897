/*
 * C smoke test of libperegrine: every call of peregrine.h against a running
 * system. Usage: peregrine_test MGMT_ADDR POOL CONT
 * Needs at least 3 engines (uses EC_2P1G1). Exit status 0 when all pass.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "peregrine.h"

static int failures;

#define CHECK(cond)                                                                \
	do {                                                                       \
		if (!(cond)) {                                                     \
			fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", \
				__FILE__, __LINE__, #cond, prg_last_error());      \
			failures++;                                                \
		}                                                                  \
	} while (0)

#define RC(call)                                                                   \
	do {                                                                       \
		int rc_ = (call);                                                  \
		if (rc_ != 0) {                                                    \
			fprintf(stderr, "%s:%d: %s = %d (%s): %s\n", __FILE__, __LINE__, \
				#call, rc_, prg_strerror(rc_), prg_last_error());  \
			failures++;                                                \
		}                                                                  \
	} while (0)

static int count_cb(const void *key, size_t len, void *arg)
{
	(void)key;
	(void)len;
	(*(int *)arg)++;
	return 0;
}

static int stop_cb(const void *key, size_t len, void *arg)
{
	(void)key;
	(void)len;
	(void)arg;
	return 42;
}

static void fill(unsigned char *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (unsigned char)((i * 2654435761u + seed) >> 8);
}

static void test_class(prg_cont_t *cont, const char *oclass, uint64_t lo)
{
	prg_obj_id_t oid;
	prg_obj_t *obj = NULL;
	char small[2], big[64];
	size_t len;
	uint64_t size = 0;
	int n;

	printf("class %s\n", oclass);
	RC(prg_obj_id_make(oclass, 0x1234, lo, &oid));
	RC(prg_obj_open(cont, oid, &obj));
	if (!obj)
		return;

	/* SINGLE values */
	len = sizeof(big);
	CHECK(prg_obj_fetch_single(obj, "d1", 2, "s", 1, big, &len) == -ENOENT);
	RC(prg_obj_update_single(obj, "d1", 2, "s", 1, "hello", 5));
	len = sizeof(small);
	CHECK(prg_obj_fetch_single(obj, "d1", 2, "s", 1, small, &len) == -ERANGE);
	CHECK(len == 5);
	len = sizeof(big);
	RC(prg_obj_fetch_single(obj, "d1", 2, "s", 1, big, &len));
	CHECK(len == 5 && memcmp(big, "hello", 5) == 0);

	/* ARRAY values, unaligned and spanning EC stripes */
	size_t alen = 300000;
	unsigned char *a = malloc(alen), *b = malloc(alen + 16);
	fill(a, alen, 7);
	RC(prg_obj_update_array(obj, "d1", 2, "arr", 3, 7, a, alen));
	RC(prg_obj_array_size(obj, "d1", 2, "arr", 3, &size));
	CHECK(size == alen + 7);
	RC(prg_obj_fetch_array(obj, "d1", 2, "arr", 3, 0, b, alen + 16));
	CHECK(memcmp(b + 7, a, alen) == 0);
	CHECK(b[0] == 0 && b[6] == 0 && b[alen + 7] == 0 && b[alen + 15] == 0);

	/* asynchronous I/O through an event queue */
	enum { NOPS = 8, CHUNK = 65536 };
	prg_eq_t *eq = NULL;
	prg_event_t ev[NOPS];
	unsigned char *w = malloc(NOPS * CHUNK), *r = calloc(NOPS, CHUNK);
	int seen = 0, got;
	fill(w, NOPS * CHUNK, 99);
	RC(prg_eq_create(&eq));
	for (int i = 0; i < NOPS; i++)
		RC(prg_obj_update_array_async(obj, "d2", 2, "async", 5, (uint64_t)i * CHUNK,
					      w + (size_t)i * CHUNK, CHUNK, eq,
					      (void *)(uintptr_t)(i + 1)));
	while (seen < NOPS) {
		got = prg_eq_poll(eq, NOPS, 10000, ev);
		CHECK(got > 0);
		if (got <= 0)
			break;
		for (int i = 0; i < got; i++) {
			CHECK(ev[i].rc == 0);
			CHECK((uintptr_t)ev[i].user_tag >= 1 && (uintptr_t)ev[i].user_tag <= NOPS);
		}
		seen += got;
	}
	CHECK(prg_eq_poll(eq, NOPS, 0, ev) == 0);
	for (int i = 0; i < NOPS; i++)
		RC(prg_obj_fetch_array_async(obj, "d2", 2, "async", 5, (uint64_t)i * CHUNK,
					     r + (size_t)i * CHUNK, CHUNK, eq, NULL));
	/* (destroying eq now would give -EBUSY, or free it if all completed) */
	CHECK(prg_eq_inflight(eq) >= 0);
	for (seen = 0; seen < NOPS;) {
		got = prg_eq_poll(eq, 3, -1, ev);
		CHECK(got > 0);
		if (got <= 0)
			break;
		for (int i = 0; i < got; i++)
			CHECK(ev[i].rc == 0);
		seen += got;
	}
	for (int i = 0; i < NOPS; i++)
		if (memcmp(r + (size_t)i * CHUNK, w + (size_t)i * CHUNK, CHUNK) != 0) {
			unsigned char *t = malloc(CHUNK);
			int rc2 = prg_obj_fetch_array(obj, "d2", 2, "async", 5, (uint64_t)i * CHUNK, t, CHUNK);
			fprintf(stderr, "%s: async chunk %d differs; sync fetch rc %d same-as-written %d same-as-async %d\n", oclass, i, rc2,
				memcmp(t, w + (size_t)i * CHUNK, CHUNK) == 0, memcmp(t, r + (size_t)i * CHUNK, CHUNK) == 0);
			free(t);
			failures++;
		}
	CHECK(prg_eq_inflight(eq) == 0);
	RC(prg_eq_destroy(eq));
	free(w);
	free(r);

	/* listing */
	n = 0;
	RC(prg_obj_list_dkeys(obj, count_cb, &n));
	CHECK(n == 2);
	n = 0;
	RC(prg_obj_list_akeys(obj, "d1", 2, count_cb, &n));
	CHECK(n == 2);
	CHECK(prg_obj_list_dkeys(obj, stop_cb, NULL) == 42);

	/* what was acknowledged survives a power cut from here on */
	RC(prg_obj_flush(obj));
	CHECK(prg_obj_flush(NULL) == -EINVAL);

	/* punches */
	const void *akeys[] = {"arr"};
	size_t akey_lens[] = {3};
	RC(prg_obj_punch_akeys(obj, "d1", 2, akeys, akey_lens, 1));
	RC(prg_obj_array_size(obj, "d1", 2, "arr", 3, &size));
	CHECK(size == 0);
	RC(prg_obj_punch_dkey(obj, "d2", 2));
	n = 0;
	RC(prg_obj_list_dkeys(obj, count_cb, &n));
	CHECK(n == 1);
	RC(prg_obj_punch(obj));
	n = 0;
	RC(prg_obj_list_dkeys(obj, count_cb, &n));
	CHECK(n == 0);

	/* bad arguments */
	CHECK(prg_obj_update_single(obj, "", 0, "s", 1, "x", 1) == -EINVAL);
	CHECK(prg_obj_fetch_single(obj, "d1", 2, "s", 1, big, NULL) == -EINVAL);
	CHECK(strlen(prg_last_error()) > 0);

	RC(prg_obj_close(obj));
	free(a);
	free(b);
}

static void test_snapshot(prg_cont_t *cont, uint64_t lo)
{
	prg_obj_id_t oid;
	prg_obj_t *obj = NULL, *snap = NULL;
	uint64_t epoch = 0;
	char buf[16];
	size_t len = sizeof(buf);
	int rc;

	RC(prg_obj_id_make("rp_2g1", 7, lo, &oid));
	RC(prg_obj_open(cont, oid, &obj));
	RC(prg_obj_update_single(obj, "d", 1, "a", 1, "old", 3));
	rc = prg_cont_snapshot(cont, "c-test", &epoch);
	if (rc == -ENOSYS) {
		printf("snapshots not supported by this system, skipped\n");
	} else {
		RC(rc);
		RC(prg_obj_update_single(obj, "d", 1, "a", 1, "new", 3));
		RC(prg_obj_open_at(cont, oid, epoch, &snap));
		RC(prg_obj_fetch_single(snap, "d", 1, "a", 1, buf, &len));
		CHECK(len == 3 && memcmp(buf, "old", 3) == 0);
		CHECK(prg_obj_update_single(snap, "d", 1, "a", 1, "x", 1) == -EROFS);
		RC(prg_obj_close(snap));
	}
	RC(prg_obj_punch(obj));
	RC(prg_obj_close(obj));
}

int main(int argc, char **argv)
{
	prg_client_t *client = NULL;
	prg_pool_t *pool = NULL;
	prg_cont_t *cont = NULL;
	prg_obj_id_t oid;
	unsigned char uuid[16];
	uint64_t lo = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();

	if (argc != 4) {
		fprintf(stderr, "usage: %s MGMT_ADDR POOL CONT\n", argv[0]);
		return 2;
	}
	CHECK(prg_obj_id_make("NO_SUCH_CLASS", 0, 0, &oid) == -EINVAL);
	CHECK(strstr(prg_last_error(), "NO_SUCH_CLASS") != NULL);
	CHECK(prg_strerror(-ENOENT) != NULL && strlen(prg_strerror(-ENOENT)) > 0);
	CHECK(prg_connect(NULL, &client) == -EINVAL);

	RC(prg_connect(argv[1], &client));
	if (!client)
		return 1;
	CHECK(prg_pool_connect(client, "no-such-pool-xyz", &pool) == -ENOENT);
	RC(prg_pool_connect(client, argv[2], &pool));
	if (!pool)
		return 1;
	RC(prg_pool_uuid(pool, uuid));
	RC(prg_cont_open(pool, argv[3], &cont));
	if (!cont)
		return 1;
	RC(prg_cont_uuid(cont, uuid));

	test_class(cont, "S1", lo);
	test_class(cont, "RP_2G1", lo + 1);
	test_class(cont, "EC_2P1G1", lo + 2);
	test_class(cont, "SX", lo + 3);
	test_snapshot(cont, lo + 4);

	/* parents may be closed before children; here in order */
	RC(prg_cont_close(cont));
	RC(prg_pool_disconnect(pool));
	RC(prg_disconnect(client));

	if (failures) {
		fprintf(stderr, "%d check(s) failed\n", failures);
		return 1;
	}
	printf("all C API checks passed\n");
	return 0;
}
