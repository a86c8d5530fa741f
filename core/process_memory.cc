#include "core/process_memory.h"

#include <cstdlib>
#include <fstream>
#include <string>

namespace fedlora {
namespace {

std::string ProcPath(pid_t pid, const char* file) {
  return (pid == 0 ? std::string("/proc/self/") : "/proc/" + std::to_string(pid) + "/") + file;
}

int64_t StatusKib(pid_t pid, const char* key) {
  std::ifstream in(ProcPath(pid, "status"));
  const std::string prefix = std::string(key) + ":";
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::atoll(line.c_str() + prefix.size());
  }
  return -1;
}

}  // namespace

int64_t ResidentKib(pid_t pid) { return StatusKib(pid, "VmRSS"); }
int64_t PeakResidentKib(pid_t pid) { return StatusKib(pid, "VmHWM"); }

void ResetPeakResident(pid_t pid) { std::ofstream(ProcPath(pid, "clear_refs")) << "5"; }

}  // namespace fedlora
