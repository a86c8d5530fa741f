// This process's (or another's) memory as Linux reports it in /proc/<pid>/status, for benchmarks
// and tests. VmHWM is the peak RSS of the current program image: unlike getrusage's ru_maxrss,
// it starts afresh at execve, so a child started from a large parent (a Python driver holding a
// model) does not inherit the parent's peak.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace fedlora {

// VmRSS (resident now) and VmHWM (peak resident) in KiB; -1 when /proc cannot be read. pid 0 is
// this process.
int64_t ResidentKib(pid_t pid = 0);
int64_t PeakResidentKib(pid_t pid = 0);

// Restarts the peak at the current RSS (Linux >= 4.0), so that the next PeakResidentKib covers
// only what happens in between.
void ResetPeakResident(pid_t pid = 0);

}  // namespace fedlora
