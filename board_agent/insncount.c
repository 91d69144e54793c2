/* xtune instruction counter: a QEMU TCG plugin (plugin API v1, qemu-user 7.2) that counts the guest
 * instructions executed at addresses >= `min` and appends "pid count\n" to the file `out` whenever a
 * guest process exits. With `blocks=1` it also records every translation block starting at or above
 * `min`, keyed by (guest vaddr, instruction count), and writes before the count line one line per block,
 * "pid b VADDR BYTES INSNS EXECS REPEATS\n" (hex vaddr): how often the block ran, and how many of those
 * runs directly followed a run of the same block (a loop body that is one block, back to back). The host
 * costs each block with llvm-mca (docs/qemu-insn-count.md). Built with host gcc only: Debian ships no qemu-plugin.h, so the handful of
 * API prototypes used are declared here, copied from QEMU 7.2's include/qemu/qemu-plugin.h.
 *
 *   gcc -shared -fPIC -O2 insncount.c -o libxtune-insncount.so
 *   qemu-aarch64 -plugin ./libxtune-insncount.so,min=0x1000000000,out=/tmp/counts ./xtune-agent
 *   qemu-aarch64 -plugin ./libxtune-insncount.so,min=0x1000000000,out=/tmp/counts,blocks=1 ./xtune-agent
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
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS };

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
                                              void *ptr, uint64_t imm);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags, void *userdata);

QEMU_PLUGIN_EXPORT int qemu_plugin_version = 1; /* QEMU refuses plugins without it */

static uint64_t min_vaddr = 1ull << 36;
static uint64_t count; /* one vCPU per process: the agent is single-threaded */
static char out_path[4096];

/* Per-block records (blocks=1). A block's record never moves once made, because its address is the
 * callback's userdata; the hash table of pointers to them grows. QEMU may translate the same guest
 * address more than once (a flushed cache, or a branch into the middle of an earlier block starts a new,
 * overlapping block there): one record per (vaddr, insns), so retranslations add up and differently
 * split blocks stay apart, each costed by its own bytes on the host. */
struct block {
    uint64_t vaddr, bytes, insns, execs, repeats;
};
static int record_blocks;
static struct block **table; /* open addressing, linear probing; size a power of two */
static size_t table_size, table_used;
static const struct block *last_block; /* the block that ran last: a repeat is a run right after itself */
static int out_of_memory;

static size_t slot_of(uint64_t vaddr, uint64_t insns, size_t size) {
    uint64_t h = (vaddr ^ (insns << 48)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 20) & (size - 1);
}

static int grow(void) {
    size_t size = table_size ? 2 * table_size : 1024;
    struct block **bigger = calloc(size, sizeof *bigger);
    if (!bigger) return -1;
    for (size_t i = 0; i < table_size; i++) {
        struct block *b = table[i];
        if (!b) continue;
        size_t j = slot_of(b->vaddr, b->insns, size);
        while (bigger[j]) j = (j + 1) & (size - 1);
        bigger[j] = b;
    }
    free(table);
    table = bigger;
    table_size = size;
    return 0;
}

static struct block *block_for(uint64_t vaddr, uint64_t bytes, uint64_t insns) {
    if (2 * (table_used + 1) > table_size && grow() < 0) return NULL;
    size_t j = slot_of(vaddr, insns, table_size);
    for (; table[j]; j = (j + 1) & (table_size - 1))
        if (table[j]->vaddr == vaddr && table[j]->insns == insns) return table[j];
    struct block *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->vaddr = vaddr;
    b->bytes = bytes;
    b->insns = insns;
    table[j] = b;
    table_used++;
    return b;
}

/* Runs before every execution of a recorded block (a helper call, not inline: it must compare with the
 * block that ran before, which API v1's only inline op, an add, cannot). Chained blocks call it too: the
 * callback is part of the block's translated code, whichever way control arrives there. */
static void on_block_exec(unsigned int vcpu, void *userdata) {
    (void)vcpu;
    struct block *b = userdata;
    b->execs++;
    if (b == last_block) b->repeats++;
    last_block = b;
    count += b->insns;
}

/* At translation time: add the number of in-range instructions of the block each time it runs.
 * A block stops early only on a fault, and a faulting run reports no count anyway. */
static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    uint64_t n = 0;
    size_t insns = qemu_plugin_tb_n_insns(tb);
    if (record_blocks) {
        uint64_t start = qemu_plugin_tb_vaddr(tb);
        if (start < min_vaddr || insns == 0) return;
        struct qemu_plugin_insn *tail = qemu_plugin_tb_get_insn(tb, insns - 1);
        uint64_t bytes = qemu_plugin_insn_vaddr(tail) + qemu_plugin_insn_size(tail) - start;
        struct block *b = block_for(start, bytes, insns);
        if (!b) {
            out_of_memory = 1;
            return;
        }
        qemu_plugin_register_vcpu_tb_exec_cb(tb, on_block_exec, QEMU_PLUGIN_CB_NO_REGS, b);
        return;
    }
    for (size_t i = 0; i < insns; i++)
        if (qemu_plugin_insn_vaddr(qemu_plugin_tb_get_insn(tb, i)) >= min_vaddr) n++;
    if (n) qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &count, n);
}

/* One short line per exiting process, appended with O_APPEND so parent and children never interleave. */
/* The block lines of an exiting process, then its count line, in one buffer written at once: the host
 * takes a count line as the end of that process's record. A process that ran no recorded block writes
 * the count line only; one whose records could not be kept writes "pid lost" instead (the host refuses
 * the run rather than cost part of it). */
static void on_process_exit(qemu_plugin_id_t id, void *userdata) {
    (void)id;
    (void)userdata;
    if (!out_path[0]) return;
    long pid = (long)getpid();
    size_t cap = 64 + 96 * table_used, n = 0;
    char *text = malloc(cap);
    if (!text) return;
    for (size_t i = 0; i < table_size && !out_of_memory; i++) {
        const struct block *b = table[i];
        if (b && b->execs)
            n += (size_t)snprintf(text + n, cap - n, "%ld b %llx %llu %llu %llu %llu\n", pid,
                                  (unsigned long long)b->vaddr, (unsigned long long)b->bytes,
                                  (unsigned long long)b->insns, (unsigned long long)b->execs,
                                  (unsigned long long)b->repeats);
    }
    if (out_of_memory)
        n += (size_t)snprintf(text + n, cap - n, "%ld lost\n", pid);
    else
        n += (size_t)snprintf(text + n, cap - n, "%ld %llu\n", pid, (unsigned long long)count);
    int fd = open(out_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (write(fd, text, n) != (ssize_t)n) { /* nothing sensible to do: the host sees no count line */ }
        close(fd);
    }
    free(text);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                           char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "min=", 4) == 0) {
            min_vaddr = strtoull(argv[i] + 4, NULL, 0);
        } else if (strcmp(argv[i], "blocks=1") == 0) {
            record_blocks = 1;
        } else if (strncmp(argv[i], "out=", 4) == 0 && strlen(argv[i] + 4) < sizeof out_path) {
            strcpy(out_path, argv[i] + 4);
        } else {
            fprintf(stderr, "xtune-insncount: unknown argument '%s' (want min=ADDR, out=FILE, blocks=1)\n", argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_atexit_cb(id, on_process_exit, NULL);
    return 0;
}
