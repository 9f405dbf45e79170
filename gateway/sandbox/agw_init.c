/*
 * agw-init: the last steps before an untrusted command runs, done by a small program that
 * cannot be talked out of them.
 *
 *   agw-init outer [--join FILE]... [--uid N --gid N] [--nproc N] [--lifeline FD] -- /abs/program args...
 *       On the host, started by the gateway (as root) in front of bwrap: join the cgroups,
 *       set the process limit, drop to an unprivileged uid/gid for good, exec the program.
 *       With --lifeline FD (a pipe whose write end only the gateway holds) it stays, as the
 *       guard of the sandbox: the program runs as its child, in its process group, and the
 *       whole group is killed the moment the lifeline reads end-of-file (the gateway died, at
 *       any moment of bwrap's setup); otherwise the guard exits as the program did.
 *
 *   agw-init inner [--verify-ro-root] [--expect PATH DEV INO ro|rw]...
 *                  [--landlock required|optional|off] [--allow PATH ACCESS]... [--no-tcp]
 *                  [--scope] [--rlimit NAME=VALUE]... [--keep-fd N]... [--hold FD]
 *                  [--init [--lifeline FD]] -- program args...
 *       Inside the sandbox, after bwrap built the mounts: prove the mounts are the ones the
 *       gateway asked for (and nosuid), set resource limits, restrict the process with
 *       Landlock and a seccomp filter that refuses set-id modes and fallocate, (with --hold) wait for the
 *       gateway's go as in hold mode, close every inherited descriptor, exec the command.
 *       With --init (bwrap --as-pid-1) the helper stays as the sandbox's PID 1 and runs the
 *       command as its child: the sandbox ends with the command, and (--lifeline) with the
 *       gateway. The gateway builds the sandbox while it makes the call's decision
 *       record durable, and says go only once it is: the sandbox's setup overlaps the fsync,
 *       and still no command runs that the audit log does not name.
 *
 *   agw-init hold FD -- program args...
 *       Wait until the byte "g" arrives on descriptor FD, close it, exec the program. The
 *       gateway starts a durable process this way and sends the byte once the process's record
 *       (with its pid) is on disk; if the gateway dies first, FD reads end-of-file and the
 *       program never runs, so no process runs that no record names.
 *
 *   agw-init netns PID NETNS_INODE SOCKET_FD SPEC...
 *       On the host, started by the gateway for a sandbox whose network is a policy: join the
 *       network namespace of sandbox process PID (after checking it is the namespace bwrap
 *       reported, by inode), through the user namespace that owns it when not root; create
 *       the sockets SPEC names there (udp:PORT on 127.0.0.1, tcp:PORT listening on 0.0.0.0,
 *       tcp-lo:PORT listening on 127.0.0.1) and pass them, in order, over the Unix socket
 *       SOCKET_FD. The gateway's resolver and proxy serve them from outside the sandbox: no
 *       process of ours runs inside, and nothing inside can reach another network.
 *
 *   agw-init seccomp-check
 *       Install the set-id filter of inner mode in this process and check that it refuses a
 *       set-id mode and allows another (gateway doctor: whether this kernel enforces it).
 *
 * Any failure prints one line, "agent-gateway sandbox: <what failed>: <why>", on stderr and
 * exits with status 125; the command is never run after a failure (fail closed).
 *
 * Only libc and the kernel ABI are used. The Landlock structures and constants are defined
 * here under names of our own: <linux/landlock.h> is missing on old hosts and, where present,
 * often older than the running kernel (Debian 12's lacks the network and scope fields).
 */
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <sched.h>
#include <unistd.h>

#define FAIL_STATUS 125

/* System call numbers: the kernel's own where the headers know them, else the numbers these
 * calls have on every architecture using the generic syscall table (and x86). */
#ifdef __NR_landlock_create_ruleset
#define AGW_NR_LANDLOCK_CREATE_RULESET __NR_landlock_create_ruleset
#else
#define AGW_NR_LANDLOCK_CREATE_RULESET 444
#endif
#ifdef __NR_landlock_add_rule
#define AGW_NR_LANDLOCK_ADD_RULE __NR_landlock_add_rule
#else
#define AGW_NR_LANDLOCK_ADD_RULE 445
#endif
#ifdef __NR_landlock_restrict_self
#define AGW_NR_LANDLOCK_RESTRICT_SELF __NR_landlock_restrict_self
#else
#define AGW_NR_LANDLOCK_RESTRICT_SELF 446
#endif
#ifdef __NR_close_range
#define AGW_NR_CLOSE_RANGE __NR_close_range
#else
#define AGW_NR_CLOSE_RANGE 436
#endif

#ifndef PR_SET_NO_NEW_PRIVS
#define PR_SET_NO_NEW_PRIVS 38
#endif

/* Landlock (Documentation/userspace-api/landlock.rst, include/uapi/linux/landlock.h). */
struct agw_ruleset_attr {
    uint64_t handled_access_fs;  /* ABI 1 */
    uint64_t handled_access_net; /* ABI 4 */
    uint64_t scoped;             /* ABI 6 */
};

struct agw_path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

_Static_assert(sizeof(struct agw_ruleset_attr) == 24, "landlock_ruleset_attr layout");
_Static_assert(sizeof(struct agw_path_beneath_attr) == 12, "landlock_path_beneath_attr layout");

#define AGW_CREATE_RULESET_VERSION (1U << 0)
#define AGW_RULE_PATH_BENEATH 1

#define AGW_FS_EXECUTE (1ULL << 0)
#define AGW_FS_WRITE_FILE (1ULL << 1)
#define AGW_FS_READ_FILE (1ULL << 2)
#define AGW_FS_READ_DIR (1ULL << 3)
#define AGW_FS_REMOVE_DIR (1ULL << 4)
#define AGW_FS_REMOVE_FILE (1ULL << 5)
#define AGW_FS_MAKE_CHAR (1ULL << 6)
#define AGW_FS_MAKE_DIR (1ULL << 7)
#define AGW_FS_MAKE_REG (1ULL << 8)
#define AGW_FS_MAKE_SOCK (1ULL << 9)
#define AGW_FS_MAKE_FIFO (1ULL << 10)
#define AGW_FS_MAKE_BLOCK (1ULL << 11)
#define AGW_FS_MAKE_SYM (1ULL << 12)
#define AGW_FS_REFER (1ULL << 13)     /* ABI 2 */
#define AGW_FS_TRUNCATE (1ULL << 14)  /* ABI 3 */
#define AGW_FS_IOCTL_DEV (1ULL << 15) /* ABI 5 */

#define AGW_NET_BIND_TCP (1ULL << 0)    /* ABI 4 */
#define AGW_NET_CONNECT_TCP (1ULL << 1) /* ABI 4 */

#define AGW_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0) /* ABI 6 */
#define AGW_SCOPE_SIGNAL (1ULL << 1)               /* ABI 6 */

/* The rights that make sense on a file (not a directory): the kernel refuses the others. */
#define AGW_FS_FILE_RIGHTS \
    (AGW_FS_EXECUTE | AGW_FS_WRITE_FILE | AGW_FS_READ_FILE | AGW_FS_TRUNCATE | AGW_FS_IOCTL_DEV)

/* ---------------------------------------------------------------------------------------- */
/* Failing                                                                                   */

/* Set in a guard (outer --lifeline) once bwrap runs as its child: see guard(). */
static int guarding = 0;

/* Write "agent-gateway sandbox: WHAT: WHY\n" as one write(2), control characters in WHAT
 * escaped (a path may hold a newline: the message must stay one line), and exit 125. */
static _Noreturn void vfail(const char *why, const char *fmt, va_list ap) {
    char what[2048];
    char line[4 * sizeof what + 256];
    size_t n = 0;

    vsnprintf(what, sizeof what, fmt, ap);
    n += (size_t)snprintf(line, sizeof line, "agent-gateway sandbox: ");
    /* line has room for every byte of what escaped (4 bytes each): n stays below its size */
    for (const unsigned char *p = (const unsigned char *)what; *p != '\0' && n + 5 < sizeof line; p++) {
        if (*p < 0x20 || *p == 0x7f) {
            n += (size_t)snprintf(line + n, sizeof line - n, "\\x%02x", *p);
        } else {
            line[n++] = (char)*p;
        }
    }
    snprintf(line + n, sizeof line - n, ": %s\n", why);
    n = strlen(line);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, line, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            break;
        }
        n -= (size_t)w;
        memmove(line, line + w, n);
    }
    if (guarding) {
        kill(0, SIGKILL); /* a guard that cannot go on takes its sandbox with it */
    }
    _exit(FAIL_STATUS);
}

/* Fail with the description of an errno value as the reason. */
static _Noreturn void fail_errno(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static _Noreturn void fail_errno(int err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(strerror(err), fmt, ap);
}

/* Fail with a reason of our own (a check that found the wrong thing, not a failed call). */
static _Noreturn void fail_because(const char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static _Noreturn void fail_because(const char *why, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(why, fmt, ap);
}

/* ---------------------------------------------------------------------------------------- */
/* Parsing                                                                                   */

/* A decimal number: digits only (no sign, no blanks, no trailing text), no overflow. */
static int parse_u64(const char *s, unsigned long long *out) {
    char *end = NULL;
    unsigned long long v;

    if (*s < '0' || *s > '9') {
        return -1;
    }
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        return -1;
    }
    *out = v;
    return 0;
}

static unsigned long long number(const char *option, const char *s) {
    unsigned long long v;
    if (parse_u64(s, &v) != 0) {
        fail_errno(EINVAL, "%s: not a decimal number: %s", option, s);
    }
    return v;
}

/* The values an option takes must be there, and none of them may be the "--" that ends the
 * options (a forgotten value would otherwise swallow the separator). */
static void need_values(int argc, char **argv, int i, int count) {
    for (int k = 1; k <= count; k++) {
        if (i + k >= argc || strcmp(argv[i + k], "--") == 0) {
            fail_errno(EINVAL, "%s needs %d value%s", argv[i], count, count == 1 ? "" : "s");
        }
    }
}

static void *allocate(size_t count, size_t size) {
    void *p = calloc(count == 0 ? 1 : count, size);
    if (p == NULL) {
        fail_errno(ENOMEM, "allocate");
    }
    return p;
}

/* ---------------------------------------------------------------------------------------- */
/* Outer mode: on the host, before bwrap                                                     */

static void join_cgroup(const char *file) {
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld", (long)getpid());
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    ssize_t w;

    if (fd < 0) {
        fail_errno(errno, "join cgroup: open %s", file);
    }
    do {
        w = write(fd, pid, (size_t)len);
    } while (w < 0 && errno == EINTR);
    if (w < 0) {
        fail_errno(errno, "join cgroup: write to %s", file);
    }
    if (w != len) {
        fail_errno(EIO, "join cgroup: short write to %s", file);
    }
    if (close(fd) != 0) {
        fail_errno(errno, "join cgroup: close %s", file);
    }
}

/* Drop to uid/gid for good: no supplementary groups, and no way back to root. */
static void drop_identity(uid_t uid, gid_t gid) {
    if (setgroups(0, NULL) != 0) {
        fail_errno(errno, "setgroups to none");
    }
    if (setresgid(gid, gid, gid) != 0) {
        fail_errno(errno, "setresgid %lu", (unsigned long)gid);
    }
    if (setresuid(uid, uid, uid) != 0) {
        fail_errno(errno, "setresuid %lu", (unsigned long)uid);
    }
    if (setresuid(0, 0, 0) == 0) {
        fail_because("root could be regained", "drop to uid %lu", (unsigned long)uid);
    }
    if (getuid() != uid || geteuid() != uid || getgid() != gid || getegid() != gid) {
        fail_because("the ids did not change", "drop to uid %lu gid %lu", (unsigned long)uid,
                     (unsigned long)gid);
    }
    if (getgroups(0, NULL) != 0) {
        fail_because("supplementary groups remain", "drop to uid %lu", (unsigned long)uid);
    }
}

/* A uid or gid to switch to: a real id (not -1, which set*id read as "leave unchanged"),
 * never 0. */
static unsigned long long target_id(const char *option, const char *s) {
    unsigned long long v = number(option, s);
    if (v == 0) {
        fail_errno(EPERM, "%s 0: the sandbox must not run as root", option);
    }
    if (v >= UINT32_MAX) {
        fail_errno(EINVAL, "%s %s: out of range", option, s);
    }
    return v;
}

static void close_inherited(const int *keep, size_t nkeep);

/* ---------------------------------------------------------------------------------------- */
/* Guard: outer mode with --lifeline, the sandbox's parent on the host                      */

/* Dying with the gateway cannot be left to parent-death signals alone. bwrap's monitor clones
 * the sandbox's first process (PID 1 of the new namespace, still bwrap) and only then tells it,
 * through an eventfd, that the uid maps are written; that process arms its own parent-death
 * signal at the very end of the setup. A monitor killed in between (by a parent-death signal
 * armed before bwrap existed, when the gateway died) leaves the first process blocked on that
 * eventfd for ever, as the sandbox's account, with no parent-death signal and nothing that
 * will ever wake it: a kill -9 of the gateway under load left such a bwrap running.
 *
 * So the outer helper forks: its child goes on (joins the cgroups, drops root, execs bwrap),
 * and the helper itself stays, as the guard, between the gateway and bwrap. bwrap runs in the
 * guard's process group, which bwrap's first process shares until its setup is done (bwrap
 * --new-session calls setsid() just before it execs the inner helper, which watches the
 * lifeline itself). The guard watches the lifeline from before bwrap exists:
 *   - end-of-file (the gateway died, at whatever moment) or anything written: SIGKILL to the
 *     whole group, itself included: the monitor and a first process still being set up end
 *     together, and one that already started its own session runs the inner helper, which
 *     sees the same lifeline cut and ends the sandbox;
 *   - SIGTERM, SIGINT or SIGHUP (the gateway ending the sandbox: its group gets them): SIGKILL
 *     to the monitor, then as below, and the guard ends by that signal;
 *   - the monitor ended: every child the guard has left is killed and reaped (it is a
 *     subreaper: a first process whose monitor died before letting it go, and the inner
 *     helper whose monitor died, are handed to it), then it exits as the monitor did.
 * The guard stays out of the sandbox's cgroups (a cgroup kill ends bwrap, and the guard reaps
 * it: the gateway reaps the guard), drops to the sandbox's account like bwrap, and keeps no
 * descriptor but the lifeline and stderr: pipes to the sandbox read end-of-file when the
 * sandbox's own processes close them. */

/* Whether a lifeline says the sandbox must end: end-of-file (every write end closed: the
 * gateway died, or ended the sandbox), or anything written. */
static int lifeline_cut(int lifeline, const char *mode) {
    struct pollfd p = {.fd = lifeline, .events = POLLIN, .revents = 0};
    int r;
    do {
        r = poll(&p, 1, 0);
    } while (r < 0 && errno == EINTR);
    if (r < 0) {
        fail_errno(errno, "%s --lifeline: poll descriptor %d", mode, lifeline);
    }
    return p.revents != 0;
}

/* The pids of our children, from the kernel's list (/proc/self/task/TID/children), else from
 * every process's parent field; at most `room`. Returns how many. */
static size_t children_of_self(pid_t *out, size_t room) {
    char path[64];
    size_t n = 0;
    pid_t me = getpid();

    snprintf(path, sizeof path, "/proc/self/task/%ld/children", (long)me);
    FILE *list = fopen(path, "re");
    if (list != NULL) {
        long pid;
        while (n < room && fscanf(list, "%ld", &pid) == 1) {
            out[n++] = (pid_t)pid;
        }
        fclose(list);
        return n;
    }
    DIR *dir = opendir("/proc");
    struct dirent *entry;
    if (dir == NULL) {
        fail_errno(errno, "guard: open /proc");
    }
    while (n < room && (entry = readdir(dir)) != NULL) {
        unsigned long long pid;
        char stat[512];
        if (parse_u64(entry->d_name, &pid) != 0 || pid > INT_MAX) {
            continue;
        }
        snprintf(path, sizeof path, "/proc/%llu/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            continue;
        }
        ssize_t len = read(fd, stat, sizeof stat - 1);
        close(fd);
        if (len <= 0) {
            continue;
        }
        stat[len] = '\0';
        char *end = strrchr(stat, ')'); /* "pid (comm) state ppid ...": comm may hold anything */
        char state;
        long ppid;
        if (end != NULL && sscanf(end + 1, " %c %ld", &state, &ppid) == 2 && ppid == (long)me) {
            out[n++] = (pid_t)pid;
        }
    }
    closedir(dir);
    return n;
}

/* Every signal at its default action and none blocked, as a freshly started program expects,
 * whatever the gateway inherited: started from a script's `cmd &` or under nohup, the gateway
 * ignores SIGINT and SIGQUIT (SIGHUP), and an ignored signal stays ignored across fork and exec,
 * so every command in every sandbox ignored them too: a session's ^C, sent to the program, was
 * lost and the program ran on. Called just before the command is exec'd.
 * Through the system call itself: the C library refuses to touch the two signals it keeps for
 * its threads (32 and 33), which a process can still have inherited as ignored (a CI run's
 * test process had 32 so). An all-zero kernel sigaction is SIG_DFL with no flags and an empty
 * mask on every architecture, whatever its layout; the kernel's signal set is 64 bits here. */
static void default_signals(void) {
    unsigned long dfl[8] = {0};
    sigset_t none;
    for (int sig = 1; sig <= 64; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP && syscall(SYS_rt_sigaction, sig, dfl, NULL, 8) != 0) {
            fail_errno(errno, "give the command signal %d at its default", sig);
        }
    }
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL) != 0) {
        fail_errno(errno, "unblock every signal for the command");
    }
}

/* Die by `sig` (with no core of ours). */
static _Noreturn void die_by(int sig) {
    struct rlimit none = {0, 0};
    sigset_t only;
    setrlimit(RLIMIT_CORE, &none);
    signal(sig, SIG_DFL);
    sigemptyset(&only);
    sigaddset(&only, sig);
    sigprocmask(SIG_UNBLOCK, &only, NULL);
    kill(getpid(), sig);
    _exit(128 + sig);
}

/* The guard's life once bwrap's monitor runs as its child `monitor` (see above). */
static _Noreturn void watch(pid_t monitor, int lifeline, int sfd) {
    int status = 0, ended = 0, asked = 0;

    while (!ended) {
        struct pollfd fds[2] = {{.fd = sfd, .events = POLLIN, .revents = 0},
                                {.fd = lifeline, .events = POLLIN, .revents = 0}};
        struct signalfd_siginfo info;
        pid_t done;
        int st;

        if (poll(fds, 2, -1) < 0 && errno != EINTR) {
            fail_errno(errno, "guard: poll");
        }
        if (fds[1].revents != 0) {
            kill(0, SIGKILL); /* the gateway is gone, or ended the sandbox */
        }
        while (read(sfd, &info, sizeof info) == (ssize_t)sizeof info) {
            if (info.ssi_signo != SIGCHLD && asked == 0) {
                asked = (int)info.ssi_signo; /* asked to end: the monitor now, the rest below */
                kill(monitor, SIGKILL);
            }
        }
        while ((done = waitpid(-1, &st, WNOHANG)) > 0) {
            if (done == monitor) {
                status = st;
                ended = 1;
            }
        }
    }
    /* what is left is the monitor's orphans: a first process it never let go, or its init */
    for (;;) {
        pid_t left[64];
        size_t n = children_of_self(left, sizeof left / sizeof *left);
        for (size_t k = 0; k < n; k++) {
            kill(left[k], SIGKILL);
        }
        pid_t done = waitpid(-1, NULL, 0);
        if (done < 0 && errno == ECHILD) {
            break;
        }
        if (done < 0 && errno != EINTR) {
            fail_errno(errno, "guard: wait");
        }
    }
    if (asked != 0) {
        die_by(asked);
    }
    if (WIFSIGNALED(status)) {
        die_by(WTERMSIG(status)); /* as the monitor did */
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : FAIL_STATUS);
}

/* Become the guard of the sandbox (outer --lifeline): fork; return in the child, which goes on
 * to start bwrap; the guard never returns. Returns the guard's pid. */
static pid_t guard(int lifeline, int have_uid, uid_t uid, gid_t gid) {
    sigset_t watched, old;
    pid_t me = getpid(), monitor;
    int sfd;

    if (lifeline_cut(lifeline, "outer")) {
        fail_because("the gateway is gone or ended the sandbox", "outer --lifeline");
    }
    /* the group it kills is its own alone (the gateway starts it in a session of its own) */
    if (getpgrp() != me && setpgid(0, 0) != 0) {
        fail_errno(errno, "outer --lifeline: a process group of its own");
    }
    if (prctl(PR_SET_CHILD_SUBREAPER, 1L, 0L, 0L, 0L) != 0) {
        fail_errno(errno, "prctl(PR_SET_CHILD_SUBREAPER)");
    }
    sigemptyset(&watched);
    sigaddset(&watched, SIGCHLD);
    sigaddset(&watched, SIGTERM);
    sigaddset(&watched, SIGINT);
    sigaddset(&watched, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &watched, &old) != 0) {
        fail_errno(errno, "guard: block signals");
    }
    sfd = signalfd(-1, &watched, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        fail_errno(errno, "signalfd");
    }
    monitor = fork();
    if (monitor < 0) {
        fail_errno(errno, "fork bwrap");
    }
    if (monitor == 0) {
        close(sfd);
        if (sigprocmask(SIG_SETMASK, &old, NULL) != 0) {
            fail_errno(errno, "restore the signal mask");
        }
        return me;
    }
    guarding = 1;
    if (have_uid) {
        drop_identity(uid, gid);
    }
    {
        int mine[2] = {lifeline < sfd ? lifeline : sfd, lifeline < sfd ? sfd : lifeline};
        close_inherited(mine, 2);
    }
    close(STDIN_FILENO);
    close(STDOUT_FILENO);
    watch(monitor, lifeline, sfd);
}

static int run_outer(int argc, char **argv) {
    const char **joins = allocate((size_t)argc, sizeof *joins);
    size_t njoins = 0;
    int have_uid = 0, have_gid = 0, have_nproc = 0, lifeline = -1;
    unsigned long long uid = 0, gid = 0, nproc = 0;
    int i = 2;

    for (; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--") == 0) {
            break;
        } else if (strcmp(opt, "--join") == 0) {
            need_values(argc, argv, i, 1);
            joins[njoins++] = argv[++i];
        } else if (strcmp(opt, "--uid") == 0) {
            need_values(argc, argv, i, 1);
            uid = target_id(opt, argv[++i]);
            have_uid = 1;
        } else if (strcmp(opt, "--gid") == 0) {
            need_values(argc, argv, i, 1);
            gid = target_id(opt, argv[++i]);
            have_gid = 1;
        } else if (strcmp(opt, "--nproc") == 0) {
            need_values(argc, argv, i, 1);
            nproc = number(opt, argv[++i]);
            have_nproc = 1;
        } else if (strcmp(opt, "--lifeline") == 0) {
            need_values(argc, argv, i, 1);
            unsigned long long fd = number(opt, argv[++i]);
            if (fd < 3 || fd > INT_MAX) {
                fail_errno(EINVAL, "--lifeline %llu: out of range", fd);
            }
            lifeline = (int)fd;
        } else {
            fail_errno(EINVAL, "outer: unknown option %s", opt);
        }
    }
    if (i >= argc) {
        fail_errno(EINVAL, "outer: no \"--\" before the program");
    }
    if (i + 1 >= argc) {
        fail_errno(EINVAL, "outer: no program after \"--\"");
    }
    if (have_uid != have_gid) {
        fail_errno(EINVAL, "outer: --uid and --gid go together");
    }
    char **program = argv + i + 1;
    if (program[0][0] != '/') {
        fail_errno(EINVAL, "outer: the program must be an absolute path: %s", program[0]);
    }

    pid_t guardian = lifeline >= 0 ? guard(lifeline, have_uid, (uid_t)uid, (gid_t)gid) : 0;
    for (size_t k = 0; k < njoins; k++) {
        join_cgroup(joins[k]);
    }
    /* Before dropping root: as root the hard limit may also be raised. */
    if (have_nproc) {
        struct rlimit lim = {(rlim_t)nproc, (rlim_t)nproc};
        if (setrlimit(RLIMIT_NPROC, &lim) != 0) {
            fail_errno(errno, "set the process limit to %llu", nproc);
        }
    }
    if (have_uid) {
        drop_identity((uid_t)uid, (gid_t)gid);
    }
    /* bwrap dies with its guard (armed after the identity change, which clears it; the exec
     * of bwrap, not set-user-ID, keeps it), and never starts if the guard is already gone */
    if (guardian != 0) {
        if (prctl(PR_SET_PDEATHSIG, (unsigned long)SIGKILL, 0L, 0L, 0L) != 0) {
            fail_errno(errno, "prctl(PR_SET_PDEATHSIG)");
        }
        if (getppid() != guardian) {
            fail_because("its guard is gone", "outer --lifeline");
        }
    }
    execv(program[0], program);
    fail_errno(errno, "exec %s", program[0]);
}

/* ---------------------------------------------------------------------------------------- */
/* Inner mode: inside the sandbox, before the command                                        */

struct expectation {
    const char *path;
    unsigned long long dev;
    unsigned long long ino;
    int read_only;
};

struct allowance {
    const char *path;
    uint64_t access;
};

struct limit {
    const char *name;
    int resource;
    rlim_t value;
};

enum landlock_mode { LANDLOCK_UNSET, LANDLOCK_OFF, LANDLOCK_OPTIONAL, LANDLOCK_REQUIRED };

static void verify_ro_root(void) {
    struct statvfs sv;
    if (statvfs("/", &sv) != 0) {
        fail_errno(errno, "statvfs /");
    }
    if ((sv.f_flag & ST_RDONLY) == 0) {
        fail_because("it is mounted read-write", "the sandbox root is not read-only");
    }
}

/* The object at PATH is the one the gateway opened on the host (same device and inode), and
 * mounted the way it asked. O_NOFOLLOW: a symlink put in place of a mount point is not it. */
static void verify_expectation(const struct expectation *e) {
    struct stat st;
    struct statvfs sv;
    char why[160];
    int fd = open(e->path, O_PATH | O_NOFOLLOW | O_CLOEXEC);

    if (fd < 0) {
        fail_errno(errno, "mount check %s: open", e->path);
    }
    if (fstat(fd, &st) != 0) {
        fail_errno(errno, "mount check %s: fstat", e->path);
    }
    if ((unsigned long long)st.st_dev != e->dev || (unsigned long long)st.st_ino != e->ino) {
        snprintf(why, sizeof why, "found device %llu inode %llu, expected device %llu inode %llu",
                 (unsigned long long)st.st_dev, (unsigned long long)st.st_ino, e->dev, e->ino);
        fail_because(why, "mount check %s: not the expected object", e->path);
    }
    if (fstatvfs(fd, &sv) != 0) {
        fail_errno(errno, "mount check %s: fstatvfs", e->path);
    }
    if ((sv.f_flag & ST_NOSUID) == 0) { /* a set-id file in a root must not work inside either */
        fail_because("mounted without nosuid", "mount check %s", e->path);
    }
    if (e->read_only && (sv.f_flag & ST_RDONLY) == 0) {
        fail_because("mounted read-write, expected read-only", "mount check %s", e->path);
    }
    if (!e->read_only && (sv.f_flag & ST_RDONLY) != 0) {
        fail_because("mounted read-only, expected read-write", "mount check %s", e->path);
    }
    close(fd);
}

static void parse_rlimit(const char *spec, struct limit *out) {
    static const struct {
        const char *name;
        int resource;
    } names[] = {
        {"cpu", RLIMIT_CPU}, {"fsize", RLIMIT_FSIZE}, {"nofile", RLIMIT_NOFILE},
        {"as", RLIMIT_AS},   {"nproc", RLIMIT_NPROC},
    };
    const char *eq = strchr(spec, '=');
    size_t len;
    unsigned long long v;

    if (eq == NULL) {
        fail_errno(EINVAL, "--rlimit %s: expected NAME=VALUE", spec);
    }
    len = (size_t)(eq - spec);
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        if (strlen(names[k].name) == len && strncmp(spec, names[k].name, len) == 0) {
            out->name = names[k].name;
            out->resource = names[k].resource;
            if (strcmp(eq + 1, "unlimited") == 0) {
                out->value = RLIM_INFINITY;
            } else if (parse_u64(eq + 1, &v) == 0) {
                out->value = (rlim_t)v;
            } else {
                fail_errno(EINVAL, "--rlimit %s: not a decimal number", spec);
            }
            return;
        }
    }
    fail_errno(EINVAL, "--rlimit %s: unknown limit (cpu, fsize, nofile, as, nproc)", spec);
}

static uint64_t parse_access(const char *path, const char *letters) {
    uint64_t access = 0;
    if (*letters == '\0') {
        fail_errno(EINVAL, "--allow %s: no access letters (r, w, c, x, d)", path);
    }
    for (const char *p = letters; *p != '\0'; p++) {
        switch (*p) {
        case 'r':
            access |= AGW_FS_READ_FILE | AGW_FS_READ_DIR;
            break;
        case 'w':
            access |= AGW_FS_WRITE_FILE | AGW_FS_TRUNCATE;
            break;
        case 'c':
            access |= AGW_FS_MAKE_CHAR | AGW_FS_MAKE_DIR | AGW_FS_MAKE_REG | AGW_FS_MAKE_SOCK |
                      AGW_FS_MAKE_FIFO | AGW_FS_MAKE_BLOCK | AGW_FS_MAKE_SYM | AGW_FS_REMOVE_DIR |
                      AGW_FS_REMOVE_FILE | AGW_FS_REFER;
            break;
        case 'x':
            access |= AGW_FS_EXECUTE;
            break;
        case 'd':
            access |= AGW_FS_IOCTL_DEV;
            break;
        default:
            fail_errno(EINVAL, "--allow %s: unknown access letter '%c' (r, w, c, x, d)", path, *p);
        }
    }
    return access;
}

/* Every filesystem right the kernel's Landlock ABI knows: all of them are handled (denied
 * unless a rule allows them). */
static uint64_t fs_rights_of_abi(long abi) {
    uint64_t rights = (AGW_FS_MAKE_SYM << 1) - 1; /* ABI 1: EXECUTE .. MAKE_SYM */
    if (abi >= 2) {
        rights |= AGW_FS_REFER;
    }
    if (abi >= 3) {
        rights |= AGW_FS_TRUNCATE;
    }
    if (abi >= 5) {
        rights |= AGW_FS_IOCTL_DEV;
    }
    return rights;
}

static void apply_landlock(enum landlock_mode mode, const struct allowance *allows, size_t nallows,
                           int no_tcp, int scope) {
    struct agw_ruleset_attr attr;
    long abi;
    int ruleset;

    if (mode == LANDLOCK_OFF) {
        return;
    }
    abi = syscall(AGW_NR_LANDLOCK_CREATE_RULESET, NULL, (size_t)0, AGW_CREATE_RULESET_VERSION);
    if (abi < 1) {
        if (mode == LANDLOCK_REQUIRED) {
            fail_errno(abi < 0 ? errno : ENOSYS, "Landlock is required but not available");
        }
        return; /* optional: this kernel has none */
    }

    /* Each restriction as far as this kernel's ABI goes, like the filesystem rights: the TCP
     * rules need ABI 4 and the scopes ABI 6; older kernels enforce the rest. (The gateway knows
     * the ABI and records it; "required" means Landlock itself must be there.) */
    memset(&attr, 0, sizeof attr);
    attr.handled_access_fs = fs_rights_of_abi(abi);
    if (no_tcp && abi >= 4) {
        attr.handled_access_net = AGW_NET_BIND_TCP | AGW_NET_CONNECT_TCP;
    }
    if (scope && abi >= 6) {
        attr.scoped = AGW_SCOPE_ABSTRACT_UNIX_SOCKET | AGW_SCOPE_SIGNAL;
    }

    ruleset = (int)syscall(AGW_NR_LANDLOCK_CREATE_RULESET, &attr, sizeof attr, 0U);
    if (ruleset < 0) {
        fail_errno(errno, "landlock_create_ruleset");
    }
    for (size_t k = 0; k < nallows; k++) {
        struct agw_path_beneath_attr rule;
        struct stat st;
        uint64_t access = allows[k].access & attr.handled_access_fs;
        int fd = open(allows[k].path, O_PATH | O_CLOEXEC);

        if (fd < 0) {
            if (errno == ENOENT) {
                continue; /* nothing there to allow */
            }
            fail_errno(errno, "--allow %s: open", allows[k].path);
        }
        if (fstat(fd, &st) != 0) {
            fail_errno(errno, "--allow %s: fstat", allows[k].path);
        }
        if (!S_ISDIR(st.st_mode)) {
            access &= AGW_FS_FILE_RIGHTS;
        }
        if (access != 0) { /* the kernel refuses an empty rule; it would allow nothing anyway */
            memset(&rule, 0, sizeof rule);
            rule.allowed_access = access;
            rule.parent_fd = fd;
            if (syscall(AGW_NR_LANDLOCK_ADD_RULE, ruleset, AGW_RULE_PATH_BENEATH, &rule, 0U) != 0) {
                fail_errno(errno, "--allow %s: landlock_add_rule", allows[k].path);
            }
        }
        close(fd);
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1L, 0L, 0L, 0L) != 0) {
        fail_errno(errno, "prctl(PR_SET_NO_NEW_PRIVS)");
    }
    if (syscall(AGW_NR_LANDLOCK_RESTRICT_SELF, ruleset, 0U) != 0) {
        fail_errno(errno, "landlock_restrict_self");
    }
    close(ruleset);
}

/* ---------------------------------------------------------------------------------------- */
/* Seccomp: no set-user-ID or set-group-ID file is made inside the sandbox                   */

/* A write root is the host's directory: a set-id bit set inside (chmod 6755 on a copy of a
 * shell) stays on the host file, where any local user could run it as the sandbox's account.
 * Mounts are nosuid, which stops it working inside only. So every call that sets a file's mode
 * is refused (EPERM) when the mode holds S_ISUID or S_ISGID: chmod, fchmod, fchmodat,
 * fchmodat2, and the mode of open, openat and creat (with O_CREAT or O_TMPFILE), mkdir,
 * mkdirat, mknod and mknodat. openat2 takes its mode in a structure a filter cannot read, and
 * io_uring opens files without system calls a filter sees: both answer ENOSYS (programs fall
 * back to openat). System calls of another ABI than the helper's own (i386 or x32 calls made
 * by an x86_64 process) are refused whole.
 *
 * The same filter refuses fallocate (EOPNOTSUPP, as a filesystem without it answers: glibc's
 * posix_fallocate then writes the blocks instead): it takes gigabytes of disk in one call,
 * faster than the gateway's watch of the disk budget can stop it (sandbox/disk.py), and with
 * FALLOC_FL_KEEP_SIZE past RLIMIT_FSIZE too. Space is then only taken as fast as data is
 * written. */

/* The architecture the helper is built for, as seccomp reports it (linux/audit.h). */
#if defined(__x86_64__) && defined(__ILP32__)
#define AGW_AUDIT_ARCH 0 /* x32: not supported, refused at run time */
#elif defined(__x86_64__)
#define AGW_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__i386__)
#define AGW_AUDIT_ARCH AUDIT_ARCH_I386
#elif defined(__aarch64__) && defined(__AARCH64EB__)
#define AGW_AUDIT_ARCH 0
#elif defined(__aarch64__)
#define AGW_AUDIT_ARCH AUDIT_ARCH_AARCH64
#elif defined(__riscv) && __riscv_xlen == 64
#define AGW_AUDIT_ARCH AUDIT_ARCH_RISCV64
#elif defined(__powerpc64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define AGW_AUDIT_ARCH AUDIT_ARCH_PPC64LE
#elif defined(__s390x__)
#define AGW_AUDIT_ARCH AUDIT_ARCH_S390X
#else
#define AGW_AUDIT_ARCH 0
#endif

/* Newer system calls an older <sys/syscall.h> may lack: their numbers in the table every
 * architecture above shares for them. */
#if !defined(__NR_fchmodat2)
#define __NR_fchmodat2 452
#endif
#if !defined(__NR_openat2)
#define __NR_openat2 437
#endif
#if !defined(__NR_io_uring_setup)
#define __NR_io_uring_setup 425
#define __NR_io_uring_enter 426
#define __NR_io_uring_register 427
#endif

#define AGW_SETID_BITS (S_ISUID | S_ISGID)
#define AGW_CREATE_FLAGS (O_CREAT | (O_TMPFILE & ~O_DIRECTORY))
#define AGW_X32_BIT 0x40000000U

/* The low 32 bits of argument n of struct seccomp_data (a mode or flags fits in them; the
 * kernel reads no more of it). */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define AGW_ARG_LOW(n) (offsetof(struct seccomp_data, args) + 8 * (n))
#else
#define AGW_ARG_LOW(n) (offsetof(struct seccomp_data, args) + 8 * (n) + 4)
#endif

#define AGW_LOAD(offset) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (offset))
#define AGW_RETURN(value) BPF_STMT(BPF_RET | BPF_K, (value))
#define AGW_ALLOW AGW_RETURN(SECCOMP_RET_ALLOW)
#define AGW_ERRNO(e) AGW_RETURN(SECCOMP_RET_ERRNO | ((e) & SECCOMP_RET_DATA))

struct agw_filter {
    struct sock_filter code[128];
    unsigned short len;
};

static void emit(struct agw_filter *f, struct sock_filter insn) {
    if (f->len >= sizeof f->code / sizeof f->code[0]) {
        fail_because("the program is too long", "seccomp filter");
    }
    f->code[f->len++] = insn;
}

/* nr -> refuse with EPERM when argument mode_arg holds a set-id bit (and, for the open family,
 * only when argument flags_arg asks to create: otherwise the mode is not used). */
static void emit_mode_check(struct agw_filter *f, long nr, int mode_arg, int flags_arg) {
    /* if (nr != this) skip the block: 5 instructions, 7 with the flags test
     *   [ld flags; jset CREATE ? next : allow;] ld mode; jset SETID ? next : allow; EPERM; allow */
    int extra = flags_arg >= 0 ? 2 : 0;
    emit(f, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, (uint8_t)(4 + extra)));
    if (flags_arg >= 0) {
        emit(f, (struct sock_filter)AGW_LOAD(AGW_ARG_LOW(flags_arg)));
        emit(f, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, AGW_CREATE_FLAGS, 0, 3));
    }
    emit(f, (struct sock_filter)AGW_LOAD(AGW_ARG_LOW(mode_arg)));
    emit(f, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, AGW_SETID_BITS, 0, 1));
    emit(f, (struct sock_filter)AGW_ERRNO(EPERM));
    emit(f, (struct sock_filter)AGW_ALLOW);
}

static void emit_refuse(struct agw_filter *f, long nr, int err) {
    emit(f, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 1));
    emit(f, (struct sock_filter)AGW_ERRNO(err));
}

static void build_setid_filter(struct agw_filter *f) {
    memset(f, 0, sizeof *f);
    emit(f, (struct sock_filter)AGW_LOAD(offsetof(struct seccomp_data, arch)));
    emit(f, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AGW_AUDIT_ARCH, 1, 0));
    emit(f, (struct sock_filter)AGW_ERRNO(ENOSYS)); /* another ABI's system call */
    emit(f, (struct sock_filter)AGW_LOAD(offsetof(struct seccomp_data, nr)));
#if defined(__x86_64__)
    emit(f, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, AGW_X32_BIT, 0, 1));
    emit(f, (struct sock_filter)AGW_ERRNO(ENOSYS)); /* x32 */
#endif
#ifdef __NR_chmod
    emit_mode_check(f, __NR_chmod, 1, -1);
#endif
    emit_mode_check(f, __NR_fchmod, 1, -1);
    emit_mode_check(f, __NR_fchmodat, 2, -1);
    emit_mode_check(f, __NR_fchmodat2, 2, -1);
#ifdef __NR_open
    emit_mode_check(f, __NR_open, 2, 1);
#endif
    emit_mode_check(f, __NR_openat, 3, 2);
#ifdef __NR_creat
    emit_mode_check(f, __NR_creat, 1, -1);
#endif
#ifdef __NR_mkdir
    emit_mode_check(f, __NR_mkdir, 1, -1);
#endif
    emit_mode_check(f, __NR_mkdirat, 2, -1);
#ifdef __NR_mknod
    emit_mode_check(f, __NR_mknod, 1, -1);
#endif
    emit_mode_check(f, __NR_mknodat, 2, -1);
    emit_refuse(f, __NR_openat2, ENOSYS);
    emit_refuse(f, __NR_io_uring_setup, ENOSYS);
    emit_refuse(f, __NR_io_uring_enter, ENOSYS);
    emit_refuse(f, __NR_io_uring_register, ENOSYS);
    emit_refuse(f, __NR_fallocate, EOPNOTSUPP);
    emit(f, (struct sock_filter)AGW_ALLOW);
}

/* Install the filter for this process and everything it starts (no way to remove it). There
 * is no sandbox without it: a kernel without seccomp filters fails the start. */
static void apply_setid_filter(void) {
    struct agw_filter f;
    struct sock_fprog prog;

    if (AGW_AUDIT_ARCH == 0) {
        fail_because("this architecture is not known to the helper", "seccomp: refuse set-id modes");
    }
    build_setid_filter(&f);
    prog.len = f.len;
    prog.filter = f.code;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1L, 0L, 0L, 0L) != 0) {
        fail_errno(errno, "prctl(PR_SET_NO_NEW_PRIVS)");
    }
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0L, 0L) != 0) {
        fail_errno(errno, "seccomp: refuse set-id modes (a kernel with seccomp filters is required)");
    }
}

static int compare_ints(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int close_span(unsigned int first, unsigned int last) {
    return (int)syscall(AGW_NR_CLOSE_RANGE, first, last, 0U);
}

/* Close every descriptor from 3 up, except the kept ones (sorted). close_range(2) for the
 * gaps between them; where it is missing (kernel < 5.9) or filtered, one close per entry of
 * /proc/self/fd. A descriptor left open could reach outside the sandbox (an O_PATH descriptor
 * of a host directory opens its parent with openat(fd, "..")). */
static void close_inherited(const int *keep, size_t nkeep) {
    unsigned int next = 3;
    int ok = 1;

    for (size_t k = 0; k < nkeep && ok; k++) {
        unsigned int fd = (unsigned int)keep[k];
        if (fd < next) {
            continue; /* 0-2, or a repeat */
        }
        if (fd > next && close_span(next, fd - 1) != 0) {
            ok = 0;
        }
        next = fd + 1;
    }
    if (ok && close_span(next, ~0U) == 0) {
        return;
    }

    DIR *dir = opendir("/proc/self/fd");
    struct dirent *entry;
    if (dir == NULL) {
        fail_errno(errno, "close inherited descriptors: open /proc/self/fd");
    }
    for (;;) {
        unsigned long long fd;
        errno = 0;
        entry = readdir(dir);
        if (entry == NULL) {
            break;
        }
        if (parse_u64(entry->d_name, &fd) != 0 || fd < 3 || fd > INT_MAX || (int)fd == dirfd(dir)) {
            continue;
        }
        int wanted = (int)fd;
        if (bsearch(&wanted, keep, nkeep, sizeof *keep, compare_ints) == NULL) {
            close(wanted);
        }
    }
    if (errno != 0) {
        fail_errno(errno, "close inherited descriptors: read /proc/self/fd");
    }
    closedir(dir);
}

/* Wait for the byte "g" on `fd` (the gateway's go) and close it; end-of-file or any other
 * byte means the gateway is gone or refused: fail, so the command never runs. The gateway holds
 * a non-blocking read end of the same pipe, to take the byte back when the sandbox ends before
 * it was taken here (then it knows for sure the command never ran, nor ever will). */
static void wait_for_go(int fd, const char *mode) {
    char go = 0;
    ssize_t r;

    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
        if (poll(&p, 1, -1) < 0) {
            if (errno == EINTR) {
                continue;
            }
            fail_errno(errno, "%s: poll descriptor %d", mode, fd);
        }
        r = read(fd, &go, 1);
        if (r >= 0 || (errno != EINTR && errno != EAGAIN)) {
            break;
        }
        /* EAGAIN: the pipe is non-blocking and the byte was taken back (the gateway ended the
         * sandbox before its go was taken): end-of-file follows */
    }
    if (r < 0) {
        fail_errno(errno, "%s: read descriptor %d", mode, fd);
    }
    if (r == 0 || go != 'g') {
        fail_because("the gateway is gone or refused the start", "%s", mode);
    }
    close(fd);
}

/* ---------------------------------------------------------------------------------------- */
/* Init: the sandbox's PID 1, whose end is the end of everything in the sandbox             */

/* Nothing is left to run when the init of a PID namespace ends: the kernel kills every other
 * process in it. With --init the helper is that init (bwrap --as-pid-1) and stays, with the
 * command as its only child, so that:
 *   - when the command ends, the sandbox ends: what it left behind (`setsid nohup x &`) dies
 *     with it, also for a durable process that outlives the gateway;
 *   - with --lifeline FD (a pipe whose write end only the gateway holds), when the gateway ends
 *     or closes it, the sandbox ends: whenever the gateway dies, even while bwrap was still
 *     building the sandbox and no parent-death signal was armed yet (checked once before the
 *     command starts, then watched).
 * The commands cannot end it before its time: an init gets no signal from inside its namespace
 * that it has no handler for (SIGKILL included), and it is not dumpable, so they cannot ptrace
 * it either. Signals from the gateway go to the command's processes; SIGKILL from outside ends
 * the init, and so the sandbox. The init exits with the command's status (128 + N for a
 * command killed by signal N, as bwrap reports it). */

static _Noreturn void run_as_init(char **program, const int *keep, size_t nkeep, int lifeline) {
    sigset_t chld;
    pid_t command;
    int sfd;

    if (getpid() != 1) {
        fail_because("not the first process of its PID namespace", "inner --init");
    }
    if (prctl(PR_SET_DUMPABLE, 0L, 0L, 0L, 0L) != 0) {
        fail_errno(errno, "prctl(PR_SET_DUMPABLE)");
    }
    if (lifeline >= 0) {
        if (prctl(PR_SET_PDEATHSIG, (unsigned long)SIGKILL, 0L, 0L, 0L) != 0) { /* and with bwrap */
            fail_errno(errno, "prctl(PR_SET_PDEATHSIG)");
        }
        if (lifeline_cut(lifeline, "inner")) {
            fail_because("the gateway is gone or ended the sandbox", "inner --lifeline");
        }
    }
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &chld, NULL) != 0) {
        fail_errno(errno, "block SIGCHLD");
    }
    command = fork();
    if (command < 0) {
        fail_errno(errno, "fork the command");
    }
    if (command == 0) {
        default_signals();
        close_inherited(keep, nkeep);
        execvp(program[0], program);
        fail_errno(errno, "exec %s", program[0]);
    }
    {
        int mine[1] = {lifeline};
        close_inherited(mine, lifeline >= 0 ? 1 : 0);
    }
    sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        fail_errno(errno, "signalfd"); /* the init's end ends the command too */
    }
    for (;;) {
        struct pollfd fds[2] = {{.fd = sfd, .events = POLLIN, .revents = 0},
                                {.fd = lifeline, .events = POLLIN, .revents = 0}};
        struct signalfd_siginfo info;
        int status;
        pid_t done;

        while ((done = waitpid(-1, &status, WNOHANG)) > 0) {
            if (done == command) {
                _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
            }
        }
        if (done < 0 && errno != EINTR) {
            fail_errno(errno, "inner --init: wait"); /* ECHILD: the command is gone unseen */
        }
        if (poll(fds, lifeline >= 0 ? 2 : 1, -1) < 0 && errno != EINTR) {
            fail_errno(errno, "inner --init: poll");
        }
        if (lifeline >= 0 && fds[1].revents != 0) {
            _exit(128 + SIGKILL); /* the gateway is gone, or ended the sandbox */
        }
        while (read(sfd, &info, sizeof info) > 0) {
        }
    }
}

static int run_inner(int argc, char **argv) {
    struct expectation *expects = allocate((size_t)argc, sizeof *expects);
    struct allowance *allows = allocate((size_t)argc, sizeof *allows);
    struct limit *limits = allocate((size_t)argc, sizeof *limits);
    int *keep = allocate((size_t)argc, sizeof *keep);
    size_t nexpects = 0, nallows = 0, nlimits = 0, nkeep = 0;
    enum landlock_mode mode = LANDLOCK_UNSET;
    int ro_root = 0, no_tcp = 0, scope = 0, hold = -1, init = 0, lifeline = -1;
    int i = 2;

    for (; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--") == 0) {
            break;
        } else if (strcmp(opt, "--verify-ro-root") == 0) {
            ro_root = 1;
        } else if (strcmp(opt, "--expect") == 0) {
            need_values(argc, argv, i, 4);
            struct expectation *e = &expects[nexpects++];
            e->path = argv[i + 1];
            e->dev = number("--expect DEV", argv[i + 2]);
            e->ino = number("--expect INO", argv[i + 3]);
            if (strcmp(argv[i + 4], "ro") == 0) {
                e->read_only = 1;
            } else if (strcmp(argv[i + 4], "rw") == 0) {
                e->read_only = 0;
            } else {
                fail_errno(EINVAL, "--expect %s: mode must be ro or rw, not %s", e->path, argv[i + 4]);
            }
            i += 4;
        } else if (strcmp(opt, "--landlock") == 0) {
            need_values(argc, argv, i, 1);
            const char *value = argv[++i];
            if (strcmp(value, "required") == 0) {
                mode = LANDLOCK_REQUIRED;
            } else if (strcmp(value, "optional") == 0) {
                mode = LANDLOCK_OPTIONAL;
            } else if (strcmp(value, "off") == 0) {
                mode = LANDLOCK_OFF;
            } else {
                fail_errno(EINVAL, "--landlock %s: expected required, optional or off", value);
            }
        } else if (strcmp(opt, "--allow") == 0) {
            need_values(argc, argv, i, 2);
            allows[nallows].path = argv[i + 1];
            allows[nallows].access = parse_access(argv[i + 1], argv[i + 2]);
            nallows++;
            i += 2;
        } else if (strcmp(opt, "--no-tcp") == 0) {
            no_tcp = 1;
        } else if (strcmp(opt, "--scope") == 0) {
            scope = 1;
        } else if (strcmp(opt, "--rlimit") == 0) {
            need_values(argc, argv, i, 1);
            parse_rlimit(argv[++i], &limits[nlimits++]);
        } else if (strcmp(opt, "--keep-fd") == 0) {
            need_values(argc, argv, i, 1);
            unsigned long long fd = number(opt, argv[++i]);
            if (fd > INT_MAX) {
                fail_errno(EINVAL, "--keep-fd %llu: out of range", fd);
            }
            keep[nkeep++] = (int)fd;
        } else if (strcmp(opt, "--hold") == 0) {
            need_values(argc, argv, i, 1);
            unsigned long long fd = number(opt, argv[++i]);
            if (fd < 3 || fd > INT_MAX) {
                fail_errno(EINVAL, "--hold %llu: out of range", fd);
            }
            hold = (int)fd;
        } else if (strcmp(opt, "--init") == 0) {
            init = 1;
        } else if (strcmp(opt, "--lifeline") == 0) {
            need_values(argc, argv, i, 1);
            unsigned long long fd = number(opt, argv[++i]);
            if (fd < 3 || fd > INT_MAX) {
                fail_errno(EINVAL, "--lifeline %llu: out of range", fd);
            }
            lifeline = (int)fd;
        } else {
            fail_errno(EINVAL, "inner: unknown option %s", opt);
        }
    }
    if (i >= argc) {
        fail_errno(EINVAL, "inner: no \"--\" before the program");
    }
    if (i + 1 >= argc) {
        fail_errno(EINVAL, "inner: no program after \"--\"");
    }
    if (lifeline >= 0 && !init) {
        fail_errno(EINVAL, "inner: --lifeline needs --init (the init watches it)");
    }
    /* Rules asked for are never dropped silently: without --landlock they are required. */
    if (mode == LANDLOCK_UNSET) {
        mode = (nallows > 0 || no_tcp || scope) ? LANDLOCK_REQUIRED : LANDLOCK_OFF;
    }
    qsort(keep, nkeep, sizeof *keep, compare_ints);

    if (ro_root) {
        verify_ro_root();
    }
    for (size_t k = 0; k < nexpects; k++) {
        verify_expectation(&expects[k]);
    }
    for (size_t k = 0; k < nlimits; k++) {
        struct rlimit lim = {limits[k].value, limits[k].value};
        if (setrlimit(limits[k].resource, &lim) != 0) {
            fail_errno(errno, "set the %s limit", limits[k].name);
        }
    }
    apply_landlock(mode, allows, nallows, no_tcp, scope);
    apply_setid_filter();
    if (hold >= 0) {
        wait_for_go(hold, "inner --hold");
    }

    char **program = argv + i + 1;
    if (init) {
        run_as_init(program, keep, nkeep, lifeline);
    }
    default_signals();
    close_inherited(keep, nkeep);
    execvp(program[0], program);
    fail_errno(errno, "exec %s", program[0]);
}

/* ---------------------------------------------------------------------------------------- */
/* Seccomp-check mode: does this kernel enforce the set-id filter? (gateway doctor)          */

static int run_seccomp_check(void) {
    int fd = (int)syscall(SYS_memfd_create, "agw-seccomp-check", 0U);
    if (fd < 0) {
        fail_errno(errno, "seccomp-check: memfd_create");
    }
    apply_setid_filter();
    if (fchmod(fd, 0755) != 0) {
        fail_errno(errno, "seccomp-check: fchmod 0755 (must be allowed)");
    }
    if (fchmod(fd, 04755) == 0 || errno != EPERM) {
        fail_because("a set-user-ID mode was not refused", "seccomp-check: fchmod 04755");
    }
    if (fchmod(fd, 02755) == 0 || errno != EPERM) {
        fail_because("a set-group-ID mode was not refused", "seccomp-check: fchmod 02755");
    }
    printf("seccomp: set-id modes refused\n");
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Hold mode: run only once the gateway says so                                              */

static int run_hold(int argc, char **argv) {
    unsigned long long fd;

    if (argc < 5 || strcmp(argv[3], "--") != 0) {
        fail_errno(EINVAL, "usage: agw-init hold FD -- program [args]");
    }
    fd = number("hold FD", argv[2]);
    if (fd > INT_MAX) {
        fail_errno(EINVAL, "hold %llu: out of range", fd);
    }
    wait_for_go((int)fd, "hold");
    execvp(argv[4], argv + 4);
    fail_errno(errno, "exec %s", argv[4]);
}

/* ---------------------------------------------------------------------------------------- */
/* Netns mode: the sandbox's own sockets, made for the gateway's resolver and proxy          */

#define AGW_NS_GET_USERNS _IO(0xb7, 0x1)
#define NETNS_MAX_SOCKETS 64

static int open_netns_socket(const char *spec) {
    int type, fd;
    unsigned long long port;
    struct sockaddr_in addr;
    const char *colon = strchr(spec, ':');

    if (colon == NULL) {
        fail_errno(EINVAL, "netns: socket %s: expected udp:PORT, tcp:PORT or tcp-lo:PORT", spec);
    }
    port = number("netns port", colon + 1);
    if (port == 0 || port > 65535) {
        fail_errno(EINVAL, "netns: socket %s: port out of range", spec);
    }
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (strncmp(spec, "udp:", 4) == 0) {
        type = SOCK_DGRAM;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (strncmp(spec, "tcp-lo:", 7) == 0) {
        type = SOCK_STREAM;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (strncmp(spec, "tcp:", 4) == 0) {
        type = SOCK_STREAM;
        addr.sin_addr.s_addr = htonl(INADDR_ANY);
    } else {
        fail_errno(EINVAL, "netns: socket %s: expected udp:PORT, tcp:PORT or tcp-lo:PORT", spec);
    }
    fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fail_errno(errno, "netns: socket %s", spec);
    }
    /* No SO_REUSEADDR or SO_REUSEPORT: nothing in the sandbox may bind beside these. */
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        fail_errno(errno, "netns: bind %s", spec);
    }
    if (type == SOCK_STREAM && listen(fd, 256) != 0) {
        fail_errno(errno, "netns: listen %s", spec);
    }
    return fd;
}

static int run_netns(int argc, char **argv) {
    char path[64];
    int netfd, userfd, sock, i, count;
    unsigned long long pid, inode, sockfd;
    struct stat st;
    int fds[NETNS_MAX_SOCKETS];
    char byte = 'n';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int) * NETNS_MAX_SOCKETS)];
        struct cmsghdr align;
    } control;
    struct msghdr msg;
    struct cmsghdr *cmsg;

    if (argc < 6) {
        fail_errno(EINVAL, "usage: agw-init netns PID NETNS_INODE SOCKET_FD SPEC...");
    }
    pid = number("netns PID", argv[2]);
    inode = number("netns inode", argv[3]);
    sockfd = number("netns socket", argv[4]);
    count = argc - 5;
    if (pid == 0 || pid > INT_MAX || sockfd > INT_MAX || count > NETNS_MAX_SOCKETS) {
        fail_errno(EINVAL, "netns: argument out of range");
    }
    snprintf(path, sizeof path, "/proc/%llu/ns/net", pid);
    netfd = open(path, O_RDONLY | O_CLOEXEC);
    if (netfd < 0) {
        fail_errno(errno, "netns: open %s", path);
    }
    /* the namespace bwrap made for this sandbox, not one a recycled pid points at */
    if (fstat(netfd, &st) != 0) {
        fail_errno(errno, "netns: stat %s", path);
    }
    if ((unsigned long long)st.st_ino != inode) {
        fail_because("not the sandbox's", "netns: %s is namespace %llu, expected %llu", path,
                     (unsigned long long)st.st_ino, inode);
    }
    if (geteuid() != 0) {
        /* an ordinary user owns the sandbox's user namespace: enter it to act on its network */
        userfd = ioctl(netfd, AGW_NS_GET_USERNS);
        if (userfd < 0) {
            fail_errno(errno, "netns: the user namespace owning %s", path);
        }
        if (setns(userfd, CLONE_NEWUSER) != 0) {
            fail_errno(errno, "netns: enter the sandbox's user namespace");
        }
        close(userfd);
    }
    if (setns(netfd, CLONE_NEWNET) != 0) {
        fail_errno(errno, "netns: enter the sandbox's network namespace");
    }
    close(netfd);
    for (i = 0; i < count; i++) {
        fds[i] = open_netns_socket(argv[5 + i]);
    }
    memset(&msg, 0, sizeof msg);
    memset(&control, 0, sizeof control);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)count);
    cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)count);
    memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * (size_t)count);
    sock = (int)sockfd;
    if (sendmsg(sock, &msg, 0) != 1) {
        fail_errno(errno, "netns: pass the sockets to the gateway");
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "outer") == 0) {
        return run_outer(argc, argv);
    }
    if (argc >= 2 && strcmp(argv[1], "inner") == 0) {
        return run_inner(argc, argv);
    }
    if (argc >= 2 && strcmp(argv[1], "hold") == 0) {
        return run_hold(argc, argv);
    }
    if (argc >= 2 && strcmp(argv[1], "netns") == 0) {
        return run_netns(argc, argv);
    }
    if (argc == 2 && strcmp(argv[1], "seccomp-check") == 0) {
        return run_seccomp_check();
    }
    fail_errno(EINVAL, "usage: agw-init outer|inner|hold|netns|seccomp-check [options] -- program [args]");
}
