# Sourced by the build scripts (setup.sh, test.sh, build_wheels.sh), after
# the system packages are in: every CMake tree configured afterwards
# compiles through ccache, with one compiler name, so that a source built
# with the same flags in several trees (the core library in build/cpp,
# build/shared, `pip install .`'s extension and each wheel) is compiled
# once and copied from the cache after that.

# ccache keys on the compiler's name: CMake's default c++ and the g++ that
# scikit-build-core takes from Python's sysconfig are one GCC, but would
# never share an entry.
export CXX=${CXX:-g++}
if command -v ccache > /dev/null; then
  # CMake reads this when it configures a new tree (pip's builds too).
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache
  # Paths inside the checkout are hashed relative to the build folder:
  # trees at one depth (build/<name>) share entries, and so do two checkouts.
  export CCACHE_BASEDIR=$PWD
fi
