#include "testing/server_process.h"

#include <fcntl.h>
#include <glob.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#ifndef SHARDKEEP_SOURCE_DIR
#define SHARDKEEP_SOURCE_DIR "."
#endif

namespace shardkeep::testing {
namespace {

bool IsExecutable(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::string FindServerBinary(const char* env_var, const std::string& venv_relative,
                             const std::string& name) {
  if (const char* env = std::getenv(env_var); env && *env) return env;
  const std::string pattern = std::string(SHARDKEEP_SOURCE_DIR) + "/" + venv_relative;
  glob_t found{};
  std::string match;
  if (::glob(pattern.c_str(), 0, nullptr, &found) == 0) {
    for (size_t i = 0; i < found.gl_pathc && match.empty(); ++i) {
      if (IsExecutable(found.gl_pathv[i])) match = found.gl_pathv[i];
    }
  }
  ::globfree(&found);
  if (!match.empty()) return match;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
      if (!dir.empty() && IsExecutable(dir + "/" + name)) return dir + "/" + name;
    }
  }
  return "";
}

Result<std::vector<int>> FreePorts(size_t count) {
  std::vector<int> fds;
  std::vector<int> ports;
  Status status;
  // Each socket stays bound until all are chosen, so they differ.
  for (size_t i = 0; i < count && status.ok(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      status = ErrnoError("socket", errno);
      break;
    }
    fds.push_back(fd);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      status = ErrnoError("binding a loopback port", errno);
      break;
    }
    ports.push_back(ntohs(address.sin_port));
  }
  for (const int fd : fds) ::close(fd);
  if (!status.ok()) return status;
  return ports;
}

Status ServerProcess::Launch(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> owned = args;
  std::vector<char*> argv;
  for (std::string& arg : owned) argv.push_back(arg.data());
  argv.push_back(nullptr);
  log_ = log;
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return ErrnoError("fork for " + args[0], errno);
  if (pid == 0) {
    // Its own process group, so that Stop() reaches every child; and gone
    // with the test process even when that one is killed.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  pid_ = pid;
  return Status::Ok();
}

bool ServerProcess::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

Status ServerProcess::Stop() {
  if (pid_ <= 0) return Status::Ok();
  ::kill(-pid_, SIGTERM);
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(10)) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Anything left of the group goes too.
  ::kill(-pid_, SIGKILL);
  pid_ = -1;
  return Status::Ok();
}

std::string ServerProcess::LogTail() const {
  std::ifstream in(log_);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() > 2000 ? all.substr(all.size() - 2000) : all;
}

}  // namespace shardkeep::testing
