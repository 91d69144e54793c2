/* xtune instruction counter: a QEMU TCG plugin (plugin API v1, qemu-user 7.2) that counts the guest
 * instructions executed at addresses >= `min` and appends "pid count\n" to the file `out` whenever a
 * guest process exits. Built with host gcc only: Debian ships no qemu-plugin.h, so the handful of
 * API prototypes used are declared here, copied from QEMU 7.2's include/qemu/qemu-plugin.h.
 *
 *   gcc -shared -fPIC -O2 insncount.c -o libxtune-insncount.so
 *   qemu-aarch64 -plugin ./libxtune-insncount.so,min=0x1000000000,out=/tmp/counts ./xtune-agent
 *
 * Why this works for the agent (docs/qemu-insn-count.md): qemu-user runs a guest fork() as a host
 * fork(), so every run child gets a private copy of the counter, starting from the parent's value,
 * which stays 0 because only run children execute kernel code. A child's exit_group runs qemu's
 * preexit_cleanup() -> qemu_plugin_user_exit() -> our atexit callback BEFORE the process ends, so
 * the line is in the file before the agent's waitpid() returns and before it sends the RUN reply.
 * A child killed by SIGKILL (timeout) writes nothing. The static agent sits low (0x400000 for gcc,
 * 0x1000000 for zig) while qemu-user maps guest mmaps (the kernel image) from 1 << 38 upwards. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define QEMU_PLUGIN_EXPORT __attribute__((visibility("default")))

typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t; /* only passed through; its layout does not matter here */
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
                                              void *ptr, uint64_t imm);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *insn);

QEMU_PLUGIN_EXPORT int qemu_plugin_version = 1; /* QEMU refuses plugins without it */

static uint64_t min_vaddr = 1ull << 36;
static uint64_t count; /* one vCPU per process: the agent is single-threaded */
static char out_path[4096];

/* At translation time: add the number of in-range instructions of the block each time it runs.
 * A block stops early only on a fault, and a faulting run reports no count anyway. */
static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    uint64_t n = 0;
    size_t insns = qemu_plugin_tb_n_insns(tb);
    for (size_t i = 0; i < insns; i++)
        if (qemu_plugin_insn_vaddr(qemu_plugin_tb_get_insn(tb, i)) >= min_vaddr) n++;
    if (n) qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &count, n);
}

/* One short line per exiting process, appended with O_APPEND so parent and children never interleave. */
static void on_process_exit(qemu_plugin_id_t id, void *userdata) {
    (void)id;
    (void)userdata;
    if (!out_path[0]) return;
    char line[64];
    int n = snprintf(line, sizeof line, "%ld %llu\n", (long)getpid(), (unsigned long long)count);
    int fd = open(out_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return;
    if (write(fd, line, (size_t)n) != n) { /* nothing sensible to do: the host sees no line */ }
    close(fd);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                           char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "min=", 4) == 0) {
            min_vaddr = strtoull(argv[i] + 4, NULL, 0);
        } else if (strncmp(argv[i], "out=", 4) == 0 && strlen(argv[i] + 4) < sizeof out_path) {
            strcpy(out_path, argv[i] + 4);
        } else {
            fprintf(stderr, "xtune-insncount: unknown argument '%s' (want min=ADDR, out=FILE)\n", argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_atexit_cb(id, on_process_exit, NULL);
    return 0;
}
