"""Memory figures of this process as Linux reports them, for the benchmark scripts."""


def peak_rss_mb():
    """This process's peak RSS (VmHWM): its own, where ru_maxrss would keep a forking parent's."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return -1.0
