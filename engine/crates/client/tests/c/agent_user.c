/*
 * A user's program without a certificate: libperegrine through the node's
 * peregrine-agent (PEREGRINE_AGENT_SOCKET), run as some uid by the agent
 * test (crates/cli/tests/agent.rs). Usage: agent_user POOL CONT EXPECT
 * EXPECT: "none" (the container open is refused with -EACCES), "read" (the
 * value d/a reads back as "admin", a write is refused with -EACCES) or
 * "write" (a write of d/b reads back) or "reopen" (writes d/c, says "ready",
 * waits for a line on stdin, the agent restarted meanwhile, then connects the
 * pool and opens the container again with the same client and reads d/c
 * back). Exit status 0 when all held.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "peregrine.h"

static int failures;

static void expect(int rc, int want, const char *what)
{
	if (rc != want) {
		fprintf(stderr, "%s = %d (%s), want %d: %s\n", what, rc, prg_strerror(rc), want,
			prg_last_error());
		failures++;
	}
}

/* Write d/c, wait while the test restarts the agent, then connect and open
 * again through the same client (its first call after the restart finds
 * the old connection broken and dials the new agent) and read d/c back. */
static bool reopen(prg_client_t *client, const char *pool_name, const char *cont_name,
		   prg_cont_t *cont, prg_obj_t *obj)
{
	prg_pool_t *pool = NULL;
	prg_obj_id_t oid;
	char buf[64], line[16];
	size_t len = sizeof(buf);

	expect(prg_obj_update_single(obj, "d", 1, "c", 1, "before", 6), 0, "update d/c");
	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin)) {
		fprintf(stderr, "no go-ahead on stdin\n");
		return false;
	}
	expect(prg_pool_connect(client, pool_name, &pool), 0, "prg_pool_connect after the restart");
	if (failures)
		return false;
	prg_cont_t *again = NULL;
	expect(prg_cont_open(pool, cont_name, &again), 0, "prg_cont_open after the restart");
	if (failures)
		return false;
	prg_obj_t *o = NULL;
	expect(prg_obj_id_make("S1", 0, 7, &oid), 0, "prg_obj_id_make");
	expect(prg_obj_open(again, oid, &o), 0, "prg_obj_open after the restart");
	if (failures)
		return false;
	expect(prg_obj_fetch_single(o, "d", 1, "c", 1, buf, &len), 0, "fetch d/c");
	if (len != 6 || memcmp(buf, "before", 6) != 0) {
		fprintf(stderr, "d/c reads %.*s, want before\n", (int)len, buf);
		failures++;
	}
	prg_obj_close(o);
	prg_obj_close(obj);
	prg_cont_close(again);
	prg_cont_close(cont);
	prg_pool_disconnect(pool);
	return failures == 0;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: agent_user POOL CONT none|read|write|reopen\n");
		return 2;
	}
	const char *mode = argv[3];
	prg_client_t *client = NULL;
	prg_pool_t *pool = NULL;
	prg_cont_t *cont = NULL;
	prg_obj_t *obj = NULL;
	prg_obj_id_t oid;
	char buf[64];
	size_t len = sizeof(buf);

	expect(prg_connect("unused", &client), 0, "prg_connect");
	if (failures)
		return 1;
	expect(prg_pool_connect(client, argv[1], &pool), 0, "prg_pool_connect");
	if (failures)
		return 1;
	int rc = prg_cont_open(pool, argv[2], &cont);
	if (strcmp(mode, "none") == 0) {
		expect(rc, -EACCES, "prg_cont_open");
		return failures ? 1 : 0;
	}
	expect(rc, 0, "prg_cont_open");
	if (failures)
		return 1;
	expect(prg_obj_id_make("S1", 0, 7, &oid), 0, "prg_obj_id_make");
	expect(prg_obj_open(cont, oid, &obj), 0, "prg_obj_open");
	if (failures)
		return 1;
	if (strcmp(mode, "read") == 0) {
		expect(prg_obj_fetch_single(obj, "d", 1, "a", 1, buf, &len), 0, "fetch d/a");
		if (len != 5 || memcmp(buf, "admin", 5) != 0) {
			fprintf(stderr, "d/a reads %.*s, want admin\n", (int)len, buf);
			failures++;
		}
		expect(prg_obj_update_single(obj, "d", 1, "a", 1, "user", 4), -EACCES,
		       "update d/a with a read-only handle");
	} else if (strcmp(mode, "reopen") == 0) {
		bool ok = reopen(client, argv[1], argv[2], cont, obj);
		prg_pool_disconnect(pool);
		prg_disconnect(client);
		return ok ? 0 : 1;
	} else {
		expect(prg_obj_update_single(obj, "d", 1, "b", 1, "user", 4), 0, "update d/b");
		expect(prg_obj_fetch_single(obj, "d", 1, "b", 1, buf, &len), 0, "fetch d/b");
		if (len != 4 || memcmp(buf, "user", 4) != 0) {
			fprintf(stderr, "d/b reads %.*s, want user\n", (int)len, buf);
			failures++;
		}
	}
	prg_obj_close(obj);
	prg_cont_close(cont);
	prg_pool_disconnect(pool);
	prg_disconnect(client);
	return failures ? 1 : 0;
}
