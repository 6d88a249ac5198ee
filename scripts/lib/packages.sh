# shellcheck shell=bash
# package_installed PKG: whether the Debian package PKG is installed for this machine's
# architecture (or is architecture-independent); `PKG:ARCH` asks for another architecture's.
# A plain `dpkg-query -W PKG` prints one status per installed architecture, so once the arm64
# rdma-core packages are installed beside the native ones for cross builds, comparing its
# output with "installed" would find them missing on every run. Sourced by the scripts that
# install their own packages.
package_installed() {
    local pkg=$1 arch
    arch=$(dpkg --print-architecture)
    [[ $pkg == *:* ]] && arch=${pkg##*:}
    dpkg-query -W -f='${db:Status-Status} ${Architecture}\n' "$pkg" 2>/dev/null |
        grep -Eqx "installed ($arch|all)"
}
