// tutti-run: starts N local ranks of a program with the torchrun-style environment (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...), prefixes each output line with its
// rank, forwards signals, and when one rank fails stops the others and exits with that rank's
// status, or (--max-restarts K) starts them all again, up to K times, as torchrun does.
// Multi-node jobs use torchrun, srun or mpirun; this is the one-machine launcher.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Stream {
  int fd = -1;
  std::string partial;
  FILE* out = stdout;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream streams[2];
};

void usage(FILE* f) {
  fprintf(f,
          "usage: tutti-run -n N [--max-restarts K] [--no-prefix] [--] program [args...]\n"
          "Starts N ranks of program on this machine with RANK, WORLD_SIZE, LOCAL_RANK,\n"
          "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TUTTI_PORT and TUTTI_SECRET set, as\n"
          "tuttiCommInitFromEnv expects. When a rank fails, stops the others and exits with\n"
          "its status; with --max-restarts K, first starts all N again (new ports and secret;\n"
          "TORCHELASTIC_RESTART_COUNT says which start it is), up to K times, as torchrun\n"
          "--max_restarts does: pair it with a program that resumes from its checkpoint\n"
          "(tutti-train --auto-resume). A signal forwarded to the ranks ends the job.\n");
}

// Binds port on the loopback address to see whether it is free (0: any; the port bound).
int tryPort(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(a);
  int got = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    got = ntohs(a.sin_port);
  }
  close(fd);
  return got;
}

// A port for rank 0 to listen on. It is free now but not held, so it is taken below the
// kernel's ephemeral range where that leaves room: a port the kernel hands out (bind to port 0)
// may go meanwhile to any connection this machine opens, and rank 0 then failed with "address
// already in use" (seen in ctest -j2).
int freePort(int avoid) {
  int lowEphemeral = 32768;
  if (FILE* f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (fscanf(f, "%d", &lowEphemeral) != 1) lowEphemeral = 32768;
    fclose(f);
  }
  constexpr int kLowest = 20000;
  for (int i = 0; i < 200 && lowEphemeral - kLowest > 1000; ++i) {
    uint32_t r = 0;
    if (getrandom(&r, sizeof(r), 0) != sizeof(r)) break;
    const int port = kLowest + int(r % uint32_t(lowEphemeral - kLowest));
    if (port != avoid && tryPort(port) == port) return port;
  }
  for (int i = 0; i < 10; ++i) {
    const int port = tryPort(0);
    if (port > 0 && port != avoid) return port;
  }
  fprintf(stderr, "tutti-run: found no free port on 127.0.0.1\n");
  exit(2);
}

std::string randomHex() {
  unsigned char b[16];
  if (getrandom(b, sizeof(b), 0) != sizeof(b)) {
    perror("tutti-run: getrandom");
    exit(2);
  }
  char hex[33];
  for (int i = 0; i < 16; ++i) snprintf(hex + 2 * i, 3, "%02x", b[i]);
  return hex;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

int exitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void emit(Stream& s, bool prefix, int rank, bool flush) {
  size_t start = 0;
  while (true) {
    size_t nl = s.partial.find('\n', start);
    if (nl == std::string::npos) break;
    if (prefix) fprintf(s.out, "[rank %d] ", rank);
    fwrite(s.partial.data() + start, 1, nl - start + 1, s.out);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  if (flush && !s.partial.empty()) {
    if (prefix) fprintf(s.out, "[rank %d] ", rank);
    fprintf(s.out, "%s\n", s.partial.c_str());
    s.partial.clear();
  }
  fflush(s.out);
}

// What every start of the job takes: the ranks, the program, the signals.
struct Job {
  int n = 0;
  bool prefix = true;
  char** program = nullptr;
  sigset_t mask;
  int sigfd = -1;
  int maxRestarts = 0;
};

struct Outcome {
  int failedRank = -1;  // the first rank that failed by itself (not after a forwarded signal)
  int failedStatus = 0;
  int forwardedSignal = 0;
  int exitCode = 0;  // the launcher's, were this start the last
};

// One start of all N ranks, until every one has ended.
Outcome runOnce(const Job& job, int restart) {
  const int n = job.n;
  const bool prefix = job.prefix;
  char** program = job.program;
  const int sigfd = job.sigfd;
  // Every start meets at ports and with a secret of its own: a rank left over from an earlier
  // start cannot join it.
  int masterPort = freePort(-1);
  int tuttiPort = freePort(masterPort);
  std::string secret = randomHex();

  std::vector<Rank> ranks(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    Rank& rk = ranks[static_cast<size_t>(r)];
    rk.rank = r;
    int pipes[2][2];
    if (pipe2(pipes[0], O_CLOEXEC) != 0 || pipe2(pipes[1], O_CLOEXEC) != 0) {
      perror("tutti-run: pipe");
      exit(2);
    }
    pid_t pid = fork();
    if (pid < 0) {
      perror("tutti-run: fork");
      exit(2);
    }
    if (pid == 0) {
      setpgid(0, 0);
      sigprocmask(SIG_UNBLOCK, &job.mask, nullptr);
      dup2(pipes[0][1], STDOUT_FILENO);
      dup2(pipes[1][1], STDERR_FILENO);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("GROUP_RANK", "0", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(masterPort).c_str(), 1);
      setenv("TUTTI_PORT", std::to_string(tuttiPort).c_str(), 1);
      setenv("TUTTI_SECRET", secret.c_str(), 1);
      setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(restart).c_str(), 1);
      setenv("TORCHELASTIC_MAX_RESTARTS", std::to_string(job.maxRestarts).c_str(), 1);
      execvp(program[0], program);
      fprintf(stderr, "tutti-run: cannot run %s: %s\n", program[0], strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid);  // also here, so a signal forwarded at once cannot miss the group
    close(pipes[0][1]);
    close(pipes[1][1]);
    rk.pid = pid;
    rk.running = true;
    rk.streams[0] = {pipes[0][0], "", stdout};
    rk.streams[1] = {pipes[1][0], "", stderr};
  }

  int running = n;
  int failedRank = -1, failedStatus = 0, forwardedSignal = 0;
  Clock::time_point killAt{};
  bool killScheduled = false;
  auto signalAll = [&](int sig) {
    for (Rank& rk : ranks) {
      if (rk.running) kill(-rk.pid, sig);
    }
  };

  while (true) {
    std::vector<pollfd> fds;
    std::vector<Stream*> owners;
    fds.push_back({sigfd, POLLIN, 0});
    owners.push_back(nullptr);
    for (Rank& rk : ranks) {
      for (Stream& s : rk.streams) {
        if (s.fd >= 0) {
          fds.push_back({s.fd, POLLIN, 0});
          owners.push_back(&s);
        }
      }
    }
    if (fds.size() == 1 && running == 0) break;
    int timeout = killScheduled ? 100 : -1;
    int rc = poll(fds.data(), fds.size(), timeout);
    if (rc < 0 && errno != EINTR) {
      perror("tutti-run: poll");
      signalAll(SIGKILL);
      exit(2);
    }
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Stream& s = *owners[k];
      char buf[65536];
      ssize_t got = read(s.fd, buf, sizeof(buf));
      int rank = 0;
      for (Rank& rk : ranks) {
        if (&rk.streams[0] == &s || &rk.streams[1] == &s) rank = rk.rank;
      }
      if (got > 0) {
        s.partial.append(buf, static_cast<size_t>(got));
        emit(s, prefix, rank, false);
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        emit(s, prefix, rank, true);
        close(s.fd);
        s.fd = -1;
      }
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      while (read(sigfd, &info, sizeof(info)) == sizeof(info)) {
        int sig = static_cast<int>(info.ssi_signo);
        if (sig == SIGCHLD) continue;
        forwardedSignal = sig;
        fprintf(stderr, "tutti-run: forwarding signal %d (%s) to all ranks\n", sig, strsignal(sig));
        signalAll(sig);
        if (!killScheduled) {
          killScheduled = true;
          killAt = Clock::now() + std::chrono::seconds(10);
        }
      }
    }
    // Reap whatever has ended.
    for (Rank& rk : ranks) {
      if (!rk.running) continue;
      int status = 0;
      if (waitpid(rk.pid, &status, WNOHANG) != rk.pid) continue;
      rk.running = false;
      rk.status = status;
      --running;
      bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && failedRank < 0 && forwardedSignal == 0) {
        failedRank = rk.rank;
        failedStatus = status;
        fprintf(stderr, "tutti-run: rank %d (pid %d) %s; stopping the other %d rank(s)\n", rk.rank,
                rk.pid, describe(status).c_str(), running);
        signalAll(SIGTERM);
        killScheduled = true;
        killAt = Clock::now() + std::chrono::seconds(5);
      }
    }
    if (killScheduled && running > 0 && Clock::now() >= killAt) {
      fprintf(stderr, "tutti-run: %d rank(s) still running after SIGTERM; sending SIGKILL\n",
              running);
      signalAll(SIGKILL);
      killAt = Clock::now() + std::chrono::hours(1);
    }
  }

  Outcome out;
  out.failedRank = failedRank;
  out.failedStatus = failedStatus;
  out.forwardedSignal = forwardedSignal;
  if (failedRank >= 0) {
    out.exitCode = exitCodeOf(failedStatus);
  } else if (forwardedSignal) {
    out.exitCode = 128 + forwardedSignal;
    for (Rank& rk : ranks) {
      if (!(WIFEXITED(rk.status) && WEXITSTATUS(rk.status) == 0)) {
        out.exitCode = exitCodeOf(rk.status);
        break;
      }
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Job job;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    } else if ((a == "-n" || a == "--nproc") && i + 1 < argc) {
      job.n = atoi(argv[++i]);
    } else if (a.rfind("-n", 0) == 0 && a.size() > 2) {
      job.n = atoi(a.c_str() + 2);
    } else if (a == "--max-restarts" || a.rfind("--max-restarts=", 0) == 0) {
      std::string v;
      if (a.size() > strlen("--max-restarts")) {
        v = a.substr(strlen("--max-restarts="));
      } else if (i + 1 < argc) {
        v = argv[++i];
      }
      char* end = nullptr;
      errno = 0;
      long k = strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || errno || k < 0 || k > 1000000) {
        fprintf(stderr, "tutti-run: --max-restarts '%s': expected an integer from 0\n",
                v.c_str());
        return 2;
      }
      job.maxRestarts = int(k);
    } else if (a == "--no-prefix") {
      job.prefix = false;
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (a[0] == '-') {
      fprintf(stderr, "tutti-run: unknown option %s\n", a.c_str());
      usage(stderr);
      return 2;
    } else {
      break;
    }
  }
  if (job.n < 1 || i >= argc) {
    usage(stderr);
    return 2;
  }
  job.program = argv + i;

  // Signals arrive through a signalfd so that the loop below sees them in order with output.
  sigemptyset(&job.mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&job.mask, sig);
  sigprocmask(SIG_BLOCK, &job.mask, nullptr);
  job.sigfd = signalfd(-1, &job.mask, SFD_CLOEXEC | SFD_NONBLOCK);

  for (int restart = 0;; ++restart) {
    Outcome out = runOnce(job, restart);
    // A signal that came after the start's last look (its ranks all gone) ends the job too,
    // rather than reach the ranks of a new start.
    if (out.failedRank >= 0 && !out.forwardedSignal && restart < job.maxRestarts) {
      signalfd_siginfo info;
      while (read(job.sigfd, &info, sizeof(info)) == sizeof(info)) {
        if (info.ssi_signo == SIGCHLD) continue;
        out.forwardedSignal = int(info.ssi_signo);
        fprintf(stderr, "tutti-run: signal %d (%s) came while rank %d's failure stopped the job: "
                "no restart\n", out.forwardedSignal, strsignal(out.forwardedSignal),
                out.failedRank);
      }
    }
    if (out.failedRank < 0 || out.forwardedSignal || restart >= job.maxRestarts) {
      if (out.failedRank >= 0) {
        fprintf(stderr, "tutti-run: job failed: rank %d %s%s\n", out.failedRank,
                describe(out.failedStatus).c_str(),
                job.maxRestarts > 0
                    ? (" (after " + std::to_string(restart) + " restart(s))").c_str()
                    : "");
      }
      return out.exitCode;
    }
    fprintf(stderr, "tutti-run: starting all %d rank(s) again (restart %d of %d)\n", job.n,
            restart + 1, job.maxRestarts);
  }
}
