/* xtune timing agent: loads a flat kernel image, holds buffers, runs and times the kernel in a
 * forked child. Binary frames over stdin/stdout; see PROTOCOL.md. C11 + Linux, libc only. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROTOCOL_VERSION 2
#define MAX_PAYLOAD (1u << 30)
#define MAX_SLOTS 32
#define MAX_ARGS 8
#define MAX_REPEAT 1024
#define MAX_NUMBER (1u << 26) /* cap of the adaptive doubling: ~2 s even for a 30 ns kernel */
#define RUN_PAYLOAD 80

enum { OP_LOAD = 1, OP_SET_BUFFER = 2, OP_RUN = 3, OP_READ_BUFFER = 4 };
enum { ST_OK = 0, ST_ERROR = 1 };
enum { RUN_OK = 0, RUN_SIGNAL = 1, RUN_TIMEOUT = 2 };

#if defined(__x86_64__)
#define ARCH "x86_64"
#elif defined(__aarch64__)
#define ARCH "aarch64"
#elif defined(__riscv) && __riscv_xlen == 64
#define ARCH "riscv64"
#else
#error "unsupported architecture"
#endif

typedef void (*kernel_fn)(void *, void *, void *, void *, void *, void *, void *, void *);

/* Shared with the run child (MAP_SHARED): the parent reads progress while the child runs, and results after. */
struct results {
    volatile uint64_t progress; /* bumped after each step; the parent's timeout counts from the last bump */
    uint32_t number;
    uint32_t count;
    uint64_t ns[MAX_REPEAT]; /* total elapsed ns of each timed repeat of `number` calls */
};

static struct { void *ptr; size_t len, mapped; } slots[MAX_SLOTS];
static uint8_t *image_rx, *image_rw; /* the same pages; two views only with the memfd method */
static size_t image_len, image_mapped;
static const char *exec_method = "none";
static struct results *res;
static size_t page_size;

static uint32_t get_u32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get_u64(const uint8_t *p) { return get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }
static void put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put_u64(uint8_t *p, uint64_t v) { put_u32(p, (uint32_t)v); put_u32(p + 4, (uint32_t)(v >> 32)); }

static void die(const char *msg) {
    fprintf(stderr, "xtune-agent: %s (errno %d: %s)\n", msg, errno, strerror(errno));
    _exit(1);
}

/* Reads exactly n bytes; returns 0 on EOF before the first byte (a clean end of session). */
static int read_full(void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(0, (uint8_t *)buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) die("read from stdin failed");
        if (r == 0) {
            if (got == 0) return 0;
            errno = 0;
            die("stdin closed in the middle of a frame");
        }
        got += (size_t)r;
    }
    return 1;
}

/* write(2), not stdio: stdout carries only the hello line and frames, never buffered stragglers. */
static void write_full(const void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(1, (const uint8_t *)buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die("write to stdout failed");
        done += (size_t)w;
    }
}

static void reply(uint8_t status, const void *payload, uint32_t len) {
    uint8_t hdr[8] = {'X', 'R', status, 0};
    put_u32(hdr + 4, len);
    write_full(hdr, 8);
    if (len) write_full(payload, len);
}

static void reply_error(const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reply(ST_ERROR, msg, n < 0 ? 0 : (uint32_t)(n < (int)sizeof msg ? n : (int)sizeof msg - 1));
}

static void skip_input(uint64_t n) {
    uint8_t tmp[4096];
    while (n) {
        size_t k = n < sizeof tmp ? (size_t)n : sizeof tmp;
        if (!read_full(tmp, k)) die("stdin closed while skipping a payload");
        n -= k;
    }
}

static size_t round_pages(size_t n) { return (n + page_size - 1) / page_size * page_size; }

/* W^X: map RW, copy, then flip to RX. Hardened kernels (SELinux execmem, PaX) refuse the flip;
 * there a memfd mapped twice (RW view + RX view) still works. Probed once at start-up. */
static int map_image(size_t len) {
    if (image_mapped) {
        munmap(image_rx, image_mapped);
        if (image_rw != image_rx) munmap(image_rw, image_mapped);
    }
    image_rx = image_rw = NULL;
    image_mapped = image_len = 0;
    size_t size = round_pages(len ? len : 1);
    if (strcmp(exec_method, "memfd") == 0) {
        int fd = memfd_create("xtune-image", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)size) != 0) return -1;
        image_rw = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        image_rx = mmap(NULL, size, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0);
        close(fd);
        if (image_rw == MAP_FAILED || image_rx == MAP_FAILED) return -1;
    } else {
        /* mmap is page aligned, which satisfies the >= 4 KiB image alignment ADRP needs. */
        image_rw = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (image_rw == MAP_FAILED) return -1;
        image_rx = image_rw;
    }
    image_mapped = size;
    return 0;
}

static int seal_image(void) {
    if (image_rw == image_rx && mprotect(image_rx, image_mapped, PROT_READ | PROT_EXEC) != 0) return -1;
    /* Required on aarch64/riscv (dc/ic, riscv_flush_icache); a no-op on x86. qemu-user hides its absence. */
    __builtin___clear_cache((char *)image_rx, (char *)image_rx + image_mapped);
    return 0;
}

static void probe_exec_method(int first) {
    static const char *methods[] = {"mprotect", "memfd"};
    for (int i = first; i < 2; i++) {
        exec_method = methods[i];
        if (map_image(1) == 0 && seal_image() == 0) return;
    }
    exec_method = "none";
}

static void op_load(uint32_t len) {
    if (strcmp(exec_method, "none") == 0) { skip_input(len); reply_error("no way to map executable memory"); return; }
    if (map_image(len) != 0) { skip_input(len); reply_error("mmap of %u bytes failed: %s", len, strerror(errno)); return; }
    if (!read_full(image_rw, len)) die("stdin closed inside LOAD");
    image_len = len;
    if (seal_image() != 0) { image_len = 0; reply_error("mprotect RX failed: %s", strerror(errno)); return; }
    uint8_t out[8];
    put_u64(out, (uint64_t)(uintptr_t)image_rx);
    reply(ST_OK, out, 8);
}

/* Buffers are MAP_SHARED so that what the run child writes is what READ_BUFFER returns. */
static void op_set_buffer(uint32_t len) {
    uint8_t hdr[8];
    if (len < 8) { skip_input(len); reply_error("SET_BUFFER payload shorter than 8 bytes"); return; }
    if (!read_full(hdr, 8)) die("stdin closed inside SET_BUFFER");
    uint32_t slot = get_u32(hdr), n = len - 8;
    if (slot >= MAX_SLOTS) { skip_input(n); reply_error("slot %u out of range (0..%d)", slot, MAX_SLOTS - 1); return; }
    size_t need = round_pages(n ? n : 1);
    if (slots[slot].mapped != need) {
        if (slots[slot].mapped) munmap(slots[slot].ptr, slots[slot].mapped);
        slots[slot].mapped = slots[slot].len = 0;
        void *p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { skip_input(n); reply_error("mmap of %u bytes failed", n); return; }
        slots[slot].ptr = p;
        slots[slot].mapped = need;
    }
    if (!read_full(slots[slot].ptr, n)) die("stdin closed inside SET_BUFFER");
    slots[slot].len = n;
    reply(ST_OK, NULL, 0);
}

static void op_read_buffer(uint32_t len) {
    uint8_t p[4];
    if (len != 4) { skip_input(len); reply_error("READ_BUFFER payload must be 4 bytes"); return; }
    if (!read_full(p, 4)) die("stdin closed inside READ_BUFFER");
    uint32_t slot = get_u32(p);
    if (slot >= MAX_SLOTS || !slots[slot].mapped) { reply_error("slot %u is not set", slot); return; }
    reply(ST_OK, slots[slot].ptr, (uint32_t)slots[slot].len);
}

struct run { uint64_t entry; uint32_t number, repeat, warmup, timeout_ms, min_repeat_us, nargs, evict;
             uint64_t flush_bytes; void *args[MAX_ARGS]; size_t lens[MAX_ARGS]; };

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void flush_cache(volatile uint8_t *buf, uint64_t n) {
    uint8_t sum = 0;
    for (uint64_t i = 0; i < n; i += 64) buf[i] = (uint8_t)i;
    for (uint64_t i = 0; i < n; i += 64) sum += buf[i];
    (void)sum;
}

/* The smallest data cache line, so that stepping by it touches every line of a buffer: x86-64 lines
 * are 64 bytes (Intel SDM vol. 3A 11.5, AMD APM vol. 2 7.1); AArch64 reads CTR_EL0.DminLine, log2 of the
 * line in 4-byte words (Arm ARM D23.2.34; Linux lets EL0 read it). */
static size_t dcache_line(void) {
#if defined(__aarch64__)
    uint64_t ctr;
    __asm__ volatile("mrs %0, ctr_el0" : "=r"(ctr));
    return (size_t)4 << ((ctr >> 16) & 0xF);
#else
    return 64;
#endif
}

/* Writes back and invalidates every line of [p, p+n) in every cache level, then waits for it to complete:
 * CLFLUSH + MFENCE on x86-64 (Intel SDM vol. 2A, CLFLUSH: "invalidates from every level of the cache
 * hierarchy"), DC CIVAC + DSB ISH on AArch64 (Arm ARM C5.3.7: clean and invalidate to the point of
 * coherency). parse_run refuses eviction where neither exists (RISC-V's base ISA has no such instruction). */
static void evict(const uint8_t *p, size_t n, size_t line) {
#if defined(__x86_64__)
    for (size_t i = 0; i < n; i += line) __asm__ volatile("clflush (%0)" ::"r"(p + i) : "memory");
    __asm__ volatile("mfence" ::: "memory");
#elif defined(__aarch64__)
    for (size_t i = 0; i < n; i += line) __asm__ volatile("dc civac, %0" ::"r"(p + i) : "memory");
    __asm__ volatile("dsb ish" ::: "memory");
#else
    (void)p, (void)n, (void)line;
#endif
}

static uint64_t time_calls(kernel_fn k, void **a, uint32_t number) {
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < number; i++) k(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
    return now_ns() - t0;
}

/* The run child: never returns, never touches stdout. */
static void run_child(const struct run *r, pid_t parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with the agent, so a hung kernel never outlives it */
    if (getppid() != parent) _exit(3); /* the agent died before prctl took effect */
    kernel_fn k = (kernel_fn)(uintptr_t)(image_rx + r->entry);
    void **a = (void **)r->args;
    if (r->repeat == 0) { /* check-only: exactly one call, no timing */
        k(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
        _exit(0);
    }
    uint8_t *flush = NULL;
    if (r->flush_bytes) {
        flush = mmap(NULL, r->flush_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (flush == MAP_FAILED) _exit(4);
    }
    /* Warm-ups go through the timing loop too: under qemu the loop's own first translation
     * otherwise lands in the first timed repeat (measured ~20 us extra). */
    for (uint32_t i = 0; i < r->warmup; i++) {
        (void)time_calls(k, a, 1);
        res->progress++;
    }
    uint32_t number = r->number;
    /* Adaptive number: double until a repeat lasts min_repeat, so short kernels are timed above
     * clock resolution and call overhead. Each step is bounded by the parent's per-step timeout. */
    uint64_t min_repeat_ns = (uint64_t)r->min_repeat_us * 1000u;
    while (r->min_repeat_us && number < MAX_NUMBER) {
        uint64_t ns = time_calls(k, a, number);
        res->progress++;
        /* A repeat that reaches min_repeat is timed once more before it counts: one preemption of
         * this process (several ms on a loaded 2-core host) would otherwise stop the doubling early
         * and leave every timed repeat short. Costs one repeat per run. */
        if (ns >= min_repeat_ns) {
            ns = time_calls(k, a, number);
            res->progress++;
            if (ns >= min_repeat_ns) break;
        }
        number *= 2;
    }
    res->number = number;
    size_t line = dcache_line();
    for (uint32_t i = 0; i < r->repeat; i++) {
        if (flush) flush_cache(flush, r->flush_bytes);
        for (uint32_t j = 0; j < r->nargs; j++)
            if (r->evict >> j & 1) evict(r->args[j], r->lens[j], line);
        res->ns[i] = time_calls(k, a, number);
        res->count = i + 1;
        res->progress++;
    }
    _exit(0);
}

/* Waits for the child; kills it when no step finished within timeout_ms. SIGCHLD is blocked, so
 * sigtimedwait wakes at once when the child ends and otherwise every `slice` to check progress. */
static int wait_child(pid_t pid, uint32_t timeout_ms, int *status) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    uint64_t slice_ms = timeout_ms / 10 < 5 ? 5 : timeout_ms / 10 > 100 ? 100 : timeout_ms / 10;
    uint64_t last = res->progress, last_ns = now_ns();
    for (;;) {
        pid_t w = waitpid(pid, status, WNOHANG);
        if (w == pid) return 0;
        if (w < 0 && errno != EINTR) die("waitpid failed");
        uint64_t t = now_ns();
        if (res->progress != last) { last = res->progress; last_ns = t; }
        if (t - last_ns >= (uint64_t)timeout_ms * 1000000u) break;
        uint64_t left = (uint64_t)timeout_ms * 1000000u - (t - last_ns);
        uint64_t wait = left < slice_ms * 1000000u ? left : slice_ms * 1000000u;
        struct timespec ts = {(time_t)(wait / 1000000000u), (long)(wait % 1000000000u)};
        sigtimedwait(&set, NULL, &ts);
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR) {}
    return 1;
}

static const char *parse_run(const uint8_t *p, struct run *r) {
    r->entry = get_u64(p);
    r->number = get_u32(p + 8);
    r->repeat = get_u32(p + 12);
    r->warmup = get_u32(p + 16);
    r->timeout_ms = get_u32(p + 20);
    r->min_repeat_us = get_u32(p + 24);
    r->nargs = get_u32(p + 28);
    r->flush_bytes = get_u64(p + 32);
    r->evict = get_u32(p + 72);
    if (get_u32(p + 76)) return "reserved field must be 0";
    if (!image_len) return "no image loaded";
    if (r->entry >= image_len) return "entry offset outside the image";
    if ((r->number == 0) != (r->repeat == 0)) return "number and repeat must both be 0 (check-only) or both >= 1";
    if (r->repeat > MAX_REPEAT) return "repeat above 1024";
    if (r->number > MAX_NUMBER) return "number above 2^26";
    if (r->nargs > MAX_ARGS) return "more than 8 args";
    if (r->timeout_ms == 0) return "timeout_ms must be >= 1";
    if (r->evict >> r->nargs) return "evict names an arg beyond nargs";
    if (r->evict && (r->number != 1 || r->min_repeat_us)) return "evicting args needs number 1 and min_repeat_us 0";
#if !defined(__x86_64__) && !defined(__aarch64__)
    if (r->evict) return "evicting args needs a cache-flush instruction (x86-64 CLFLUSH, AArch64 DC CIVAC)";
#endif
    for (uint32_t i = 0; i < MAX_ARGS; i++) {
        uint32_t slot = get_u32(p + 40 + 4 * i);
        r->args[i] = NULL;
        r->lens[i] = 0;
        if (i >= r->nargs) continue;
        if (slot >= MAX_SLOTS || !slots[slot].mapped) return "an arg names a slot that is not set";
        r->args[i] = slots[slot].ptr;
        r->lens[i] = slots[slot].len;
    }
    return NULL;
}

static void op_run(uint32_t len) {
    uint8_t p[RUN_PAYLOAD];
    struct run r;
    if (len != RUN_PAYLOAD) { skip_input(len); reply_error("RUN payload must be %d bytes", RUN_PAYLOAD); return; }
    if (!read_full(p, RUN_PAYLOAD)) die("stdin closed inside RUN");
    const char *err = parse_run(p, &r);
    if (err) { reply_error("%s", err); return; }
    memset(res, 0, sizeof *res);
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) { reply_error("fork failed: %s", strerror(errno)); return; }
    if (pid == 0) run_child(&r, parent);
    int status = 0;
    int timed_out = wait_child(pid, r.timeout_ms, &status);
    if (!timed_out && WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        reply_error("run child exited with code %d", WEXITSTATUS(status));
        return;
    }
    uint32_t run_status = timed_out ? RUN_TIMEOUT : WIFSIGNALED(status) ? RUN_SIGNAL : RUN_OK;
    uint32_t count = run_status == RUN_OK ? res->count : 0;
    static uint8_t out[16 + 8 * MAX_REPEAT];
    put_u32(out, run_status);
    put_u32(out + 4, run_status == RUN_SIGNAL ? (uint32_t)WTERMSIG(status) : 0);
    put_u32(out + 8, run_status == RUN_OK ? res->number : 0);
    put_u32(out + 12, count);
    for (uint32_t i = 0; i < count; i++) put_u64(out + 16 + 8 * i, res->ns[i]);
    reply(ST_OK, out, 16 + 8 * count);
}

/* Usage: xtune-agent [--exec=memfd]; the flag skips the mprotect method (to test the fallback). */
int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN); /* a vanished host shows up as a write error, and we exit */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL); /* so SIGCHLD stays pending for sigtimedwait */
    page_size = (size_t)sysconf(_SC_PAGESIZE);
    res = mmap(NULL, round_pages(sizeof *res), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) die("mmap of the results page failed");
    probe_exec_method(argc > 1 && strcmp(argv[1], "--exec=memfd") == 0);
    char hello[160];
    int n = snprintf(hello, sizeof hello, "XTUNE-AGENT %d arch=%s pid=%ld page=%zu exec=%s\n",
                     PROTOCOL_VERSION, ARCH, (long)getpid(), page_size, exec_method);
    write_full(hello, (size_t)n);
    for (;;) {
        uint8_t hdr[8];
        if (!read_full(hdr, 8)) return 0; /* host closed stdin: the session is over */
        uint32_t len = get_u32(hdr + 4);
        if (hdr[0] != 'X' || hdr[1] != 'Q' || len > MAX_PAYLOAD) {
            errno = 0;
            die("malformed request header");
        }
        switch (hdr[2]) {
        case OP_LOAD: op_load(len); break;
        case OP_SET_BUFFER: op_set_buffer(len); break;
        case OP_RUN: op_run(len); break;
        case OP_READ_BUFFER: op_read_buffer(len); break;
        default: skip_input(len); reply_error("unknown op %u", hdr[2]);
        }
    }
}
