/*
 * A user's program without a certificate: libperegrine through the node's
 * peregrine-agent (PEREGRINE_AGENT_SOCKET), run as some uid by the agent
 * test (crates/cli/tests/agent.rs). Usage: agent_user POOL CONT EXPECT
 * EXPECT: "none" (the container open is refused with -EACCES), "read" (the
 * value d/a reads back as "admin", a write is refused with -EACCES) or
 * "write" (a write of d/b reads back). Exit status 0 when all held.
 */
#include <errno.h>
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

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: agent_user POOL CONT none|read|write\n");
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
