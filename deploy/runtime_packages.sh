#!/bin/sh
# Prints, one per line, the packages that hold the shared libraries BINARY loads (dpkg's database),
# for the runtime image to install by name. Fails when a library belongs to no package.
set -eu
binary=$1
ldd "$binary" | awk '/=>/ { print $3 }' | while read -r lib; do
  # Merged /usr: dpkg knows a library by either its resolved path or the path ldd shows.
  pkg=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null) || {
    echo "runtime_packages: $lib belongs to no package" >&2
    exit 1
  }
  echo "${pkg%%:*}"
done | sort -u
