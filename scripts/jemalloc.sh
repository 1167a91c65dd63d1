#!/usr/bin/env bash
# Builds the pinned-host arena's private jemalloc into deps/jemalloc/ (once; shared by every build
# tree): a shared library, lib/libwavelet-jemalloc.so, from Debian's jemalloc source package.
#
# Why not Debian's binaries: its jemalloc uses initial-exec TLS (2.6 KiB), which, linked into
# libwavelet.so, makes a dlopen of libwavelet.so fail unless the program raises glibc's optional
# static TLS. Built here: names prefixed wl__je_ (the process's malloc stays glibc's), dynamic
# TLS, no libdl (no dlsym call into libwavelet.so's hook) and the arena's options built in.
# CMake (cmake/WaveletJemalloc.cmake) copies the library beside libwavelet.so, which loads it
# with dlopen. On any failure (no network, no source, a build error) it says so in one line and
# exits 0: the build then falls back to Debian's static archive and its TLS. CI too: a CI
# machine without network must still test everything else (the fallback is said in one line, and
# test_pinned's missing_library case is then compiled out).
#   scripts/jemalloc.sh           # run by scripts/setup.sh
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dest=$root/deps/jemalloc

# The upstream release inside Debian's source package (its two patches are for hurd and
# loongarch, not needed here), and the SHA-256 of its orig tarball (apt checks the download
# against the signed index too).
version=5.3.0
sha256=2db82d1e7119df3e71b7640219b6dfe84789bc0537983c3b7ac4f7189aecfeaa
mirror=${WAVELET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
conf_args=(--disable-initial-exec-tls --with-jemalloc-prefix=wl__je_
           --with-private-namespace=wl__je_int_ --disable-cxx --disable-libdl
           --with-malloc-conf=tcache:false,narenas:1,background_thread:false)
make_args=(EXTRA_CFLAGS=-g0 EXTRA_LDFLAGS=-Wl,-soname,libwavelet-jemalloc.so)
stamp="jemalloc $version $sha256 ${conf_args[*]} ${make_args[*]}"

if [ -f "$dest/stamp" ] && [ "$(cat "$dest/stamp")" = "$stamp" ] &&
   [ -f "$dest/lib/libwavelet-jemalloc.so" ] && [ -f "$dest/include/jemalloc/jemalloc.h" ]; then
  exit 0
fi

mkdir -p "$root/deps"
# Two builds started at once (build/ and build-asan/ on a fresh clone) build it once.
exec 9>"$root/deps/.jemalloc.lock"
flock 9
if [ -f "$dest/stamp" ] && [ "$(cat "$dest/stamp")" = "$stamp" ]; then exit 0; fi

work=$(mktemp -d "${TMPDIR:-/tmp}/wavelet-jemalloc.XXXXXX")
log=$root/deps/jemalloc.log
trap 'rm -rf "$work"' EXIT
: >"$log"

fail() {
  rm -rf "$dest"
  echo "wavelet: could not build the private jemalloc ($1; see deps/jemalloc.log): falling" \
       "back to Debian's static jemalloc, whose initial-exec TLS makes a dlopen of libwavelet.so" \
       "need GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384 (LD_PRELOAD is unaffected)" >&2
  exit 0
}

run() { "$@" >>"$log" 2>&1; }

echo "wavelet: building the private jemalloc $version into deps/jemalloc (about a minute, once)"

# Debian's source package through apt, with a sources list and index of our own: the system's
# apt configuration is neither needed nor changed.
apt_opts=(-o "Dir::Etc::sourcelist=$work/src.sources" -o Dir::Etc::sourceparts=/dev/null
          -o "Dir::State::Lists=$work/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=
          -o Acquire::Retries=1 -o Acquire::http::Timeout=20)
[ "$(id -u)" -eq 0 ] && apt_opts+=(-o APT::Sandbox::User=root)
mkdir -p "$work/lists/partial" "$work/dl" "$work/src"
suite=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
  "$mirror" "${suite:-bookworm}" /usr/share/keyrings/debian-archive-keyring.gpg >"$work/src.sources"
command -v apt-get >/dev/null || fail "no apt-get"
run apt-get "${apt_opts[@]}" --error-on=any update || fail "apt-get update of Debian's source index failed"
# The installed Debian revision when the index has it, else the index's: either way the orig
# tarball must be the release above.
deb_ver=$(dpkg-query -W -f='${Version}' libjemalloc-dev 2>/dev/null) || deb_ver=
get() { (cd "$work/dl" && run apt-get "${apt_opts[@]}" source --download-only "$1"); }
{ [ -n "$deb_ver" ] && get "jemalloc=$deb_ver"; } || get jemalloc || fail "apt-get source jemalloc failed"
tarball=$(ls "$work/dl"/jemalloc_"$version".orig.tar.* 2>/dev/null | head -n 1)
[ -n "$tarball" ] || fail "the source package holds no jemalloc $version"
echo "$sha256  $tarball" | run sha256sum -c - || fail "$(basename "$tarball"): checksum mismatch"
run tar xf "$tarball" -C "$work/src" --strip-components=1 || fail "cannot unpack $tarball"

jobs=$(nproc 2>/dev/null || echo 2)
[ "$jobs" -gt 2 ] && jobs=2 # the machine's other builds share it
(cd "$work/src" && run ./configure "${conf_args[@]}") || fail "configure failed"
(cd "$work/src" && run make -j "$jobs" "${make_args[@]}" build_lib_shared) || fail "make failed"

so=$work/src/lib/libjemalloc.so.2
# What makes it worth having: no static TLS, only prefixed names, no dlsym.
readelf -dW "$so" 2>/dev/null | grep -q STATIC_TLS && fail "the library still uses static TLS"
nm -D --defined-only "$so" 2>/dev/null | awk '{print $NF}' | grep -qv '^wl__je_' &&
  fail "the library defines names without the wl__je_ prefix"
nm -D --undefined-only "$so" 2>/dev/null | grep -qw dlsym && fail "the library calls dlsym"

rm -rf "$dest" "$dest.new"
mkdir -p "$dest.new/lib" "$dest.new/include/jemalloc" || fail "cannot write deps/"
cp "$so" "$dest.new/lib/libwavelet-jemalloc.so" &&
  cp "$work/src/include/jemalloc/jemalloc.h" "$dest.new/include/jemalloc/" &&
  cp "$work/src/COPYING" "$dest.new/" &&
  echo "$stamp" >"$dest.new/stamp" &&
  mv "$dest.new" "$dest" || { rm -rf "$dest.new"; fail "cannot write deps/"; }
