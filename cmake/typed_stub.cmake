# Rewrites the generated stub of shardkeep._core (see CMakeLists.txt): the
# import of its test-only submodule by the name it was generated under
# becomes a plain module attribute.
file(READ "${IN}" stub)
string(REPLACE "from _core import testing as testing"
       "import types\n\ntesting: types.ModuleType" stub "${stub}")
if(stub MATCHES "from _core import")
  message(FATAL_ERROR "typed_stub.cmake: ${IN} imports from _core by another name")
endif()
file(WRITE "${OUT}" "${stub}")
