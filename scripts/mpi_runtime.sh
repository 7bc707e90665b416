#!/usr/bin/env bash
# scripts/mpi_runtime.sh: a relocatable copy of this machine's Open MPI runtime (Debian's
# openmpi-bin 4.1 with PMIx), so that the project's MPI tests and trainings can run under
# `mpirun -n N` on a GPU machine that has no MPI installed and whose system directories we
# cannot change.
#
#   scripts/mpi_runtime.sh pack DIR   here: copies mpirun, the shared libraries a bare
#                                     machine lacks, the MCA components a single-host job needs,
#                                     help texts and a small config into DIR (about 8 MiB)
#   scripts/mpi_runtime.sh env DIR    there: prints `export` lines to eval, e.g.
#                                     eval "$(scripts/mpi_runtime.sh env build-gpu-pack/mpi)"
#
# How: Debian builds Open MPI for prefix /usr with its libraries, components and help texts in
# scattered places, so setting OPAL_PREFIX alone does not find them. Both Open MPI and PMIx read
# their install directories from the environment (OPAL_* and PMIX_* "installdirs" variables), so
# `env` names each directory of the copy explicitly; the component paths are also given as MCA
# parameters, which mpirun passes on to its ranks. The libraries are found through
# LD_LIBRARY_PATH, which the ranks inherit too. Only components that run a job on one host over
# shared memory or TCP are kept; those needing libraries we do not carry (verbs, UCX, libfabric,
# PSM, OpenSHMEM, MPI-IO) are left out, which also keeps Open MPI from warning about them.
set -euo pipefail

SYS_LIB=/usr/lib/x86_64-linux-gnu
OMPI_COMPONENTS=$SYS_LIB/openmpi/lib/openmpi3
PMIX_HOME=$SYS_LIB/pmix2

# Libraries that mpirun, libmpi.so.40 and the kept components need beyond glibc, libz and
# libstdc++ (checked with ldd); libmunge and libudev are dependencies of libpmix and libhwloc.
# libmpi_cxx: our binaries link CMake's MPI::MPI_CXX, which records it as needed.
LIBS=(libmpi.so.40 libmpi_cxx.so.40 libopen-rte.so.40 libopen-pal.so.40 libmca_common_sm.so.40
  libpmix.so.2 libhwloc.so.15 libevent_core-2.1.so.7 libevent_pthreads-2.1.so.7
  libmunge.so.2 libudev.so.1)

# Open MPI components (mca_FRAMEWORK_NAME.so) for a single-host run: the launcher's
# frameworks (ORTE), then the MPI layer (ob1 over self/vader/tcp, collectives, one-sided).
OMPI_KEEP=(
  plm_isolated odls_default ess_hnp ess_pmi ess_singleton pmix_ext3x pmix_isolated oob_tcp
  rml_oob routed_binomial routed_direct routed_radix grpcomm_direct iof_hnp errmgr_default_app
  errmgr_default_hnp state_app state_hnp state_novm rmaps_mindist rmaps_ppr rmaps_rank_file
  rmaps_round_robin rmaps_seq regx_fwd regx_naive regx_reverse schizo_ompi schizo_orte rtc_hwloc
  filem_raw pstat_linux shmem_mmap shmem_posix shmem_sysv reachable_weighted
  pml_ob1 bml_r2 btl_self btl_vader btl_tcp coll_basic coll_tuned coll_libnbc coll_self
  coll_sm coll_inter coll_sync coll_han coll_adapt osc_sm osc_rdma topo_basic op_avx
  allocator_basic allocator_bucket mpool_hugepage rcache_grdma
)
# PMIx's own plugins: the resource-manager default and message compression.
PMIX_KEEP=(prm_default pcompress_zlib)

die() { echo "mpi_runtime: $*" >&2; exit 2; }

# Copies FILE to DEST under FILE's own name, following symlinks so that sonames stay usable.
copy() { cp -L --preserve=mode "$1" "$2/"; }

pack_binaries() {
  local dir=$1
  mkdir -p "$dir/bin"
  copy /usr/bin/orterun "$dir/bin"
  copy /usr/bin/ompi_info "$dir/bin"  # to check the copy on the target: ompi_info --path all
  ln -sf orterun "$dir/bin/mpirun"
}

pack_libraries() {
  local dir=$1 lib
  mkdir -p "$dir/lib" "$dir/lib/hwloc"  # hwloc/: deliberately empty, see print_env
  for lib in "${LIBS[@]}"; do copy "$SYS_LIB/$lib" "$dir/lib"; done
}

pack_components() {
  local dir=$1 c
  mkdir -p "$dir/lib/openmpi3" "$dir/lib/pmix"
  for c in "${OMPI_KEEP[@]}"; do copy "$OMPI_COMPONENTS/mca_$c.so" "$dir/lib/openmpi3"; done
  for c in "${PMIX_KEEP[@]}"; do copy "$PMIX_HOME/lib/pmix/pmix_mca_$c.so" "$dir/lib/pmix"; done
}

# Help texts turn error codes into readable messages; without them every error reads
# "help file not found".
pack_help() {
  local dir=$1
  mkdir -p "$dir/share/openmpi" "$dir/share/pmix"
  cp /usr/share/openmpi/help-*.txt "$dir/share/openmpi/"
  cp "$PMIX_HOME"/share/pmix/help-*.txt "$dir/share/pmix/"
}

# Our own config replaces /etc/openmpi's, whose exclusions name components we do not carry.
pack_config() {
  local dir=$1
  mkdir -p "$dir/etc"
  : >"$dir/etc/openmpi-default-hostfile"  # no hosts listed: the local host only
  cat >"$dir/etc/openmpi-mca-params.conf" <<'EOF'
# Written by scripts/mpi_runtime.sh pack.
# One host only: the isolated launcher forks the ranks itself. The default (rsh) refuses to
# start at all where neither ssh nor rsh is installed, although a local job never uses them.
plm = isolated
# Containers often forbid process_vm_readv (no CAP_SYS_PTRACE), which makes vader's default
# single-copy transfers fail at run time; copying through the shared segment always works.
btl_vader_single_copy_mechanism = none
EOF
  : >"$dir/etc/pmix-mca-params.conf"
}

pack() {
  local dir=$1
  [[ -x /usr/bin/orterun && -d $OMPI_COMPONENTS && -d $PMIX_HOME ]] ||
    die "Debian's openmpi-bin/libopenmpi3/libpmix2 are not installed here"
  # Repacking replaces an earlier copy, but never wipes a directory that holds something else.
  if [[ -e $dir && ! -x $dir/bin/orterun && -n $(ls -A "$dir" 2>/dev/null) ]]; then
    die "$dir exists and is not an earlier pack; give an empty or new directory"
  fi
  rm -rf "$dir"
  pack_binaries "$dir"
  pack_libraries "$dir"
  pack_components "$dir"
  pack_help "$dir"
  pack_config "$dir"
  du -sh "$dir" | sed 's/^/mpi_runtime: packed /'
}

# HWLOC_PLUGINS_PATH points at an empty directory so that hwloc plugins installed on the target
# for another hwloc version (or needing libraries it lacks) are not loaded.
print_env() {
  local dir
  dir=$(cd "$1" 2>/dev/null && pwd -P) || die "no such directory: $1"
  [[ -x $dir/bin/orterun ]] || die "$dir is not a packed runtime (run: $0 pack DIR)"
  cat <<EOF
export PATH="$dir/bin:\$PATH"
export LD_LIBRARY_PATH="$dir/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export OPAL_PREFIX="$dir" OPAL_EXEC_PREFIX="$dir" OPAL_BINDIR="$dir/bin"
export OPAL_LIBDIR="$dir/lib" OPAL_PKGLIBDIR="$dir/lib/openmpi3"
export OPAL_DATAROOTDIR="$dir/share" OPAL_DATADIR="$dir/share" OPAL_PKGDATADIR="$dir/share/openmpi"
export OPAL_SYSCONFDIR="$dir/etc"
export OMPI_MCA_mca_base_component_path="$dir/lib/openmpi3"
export PMIX_PREFIX="$dir" PMIX_EXEC_PREFIX="$dir" PMIX_LIBDIR="$dir/lib" PMIX_PKGLIBDIR="$dir/lib/pmix"
export PMIX_DATAROOTDIR="$dir/share" PMIX_DATADIR="$dir/share" PMIX_PKGDATADIR="$dir/share/pmix"
export PMIX_SYSCONFDIR="$dir/etc"
export PMIX_MCA_mca_base_component_path="$dir/lib/pmix"
export HWLOC_PLUGINS_PATH="$dir/lib/hwloc"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
EOF
}

case "${1:-} ${2:+x}" in
  "pack x") pack "$2" ;;
  "env x") print_env "$2" ;;
  *) echo "usage: $0 pack DIR | env DIR" >&2; exit 2 ;;
esac
