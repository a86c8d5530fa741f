// fedlora's version, written once: CMakeLists.txt reads it for project(), `fedlora --version`
// prints it, and the client SDK sends it in Join.
#pragma once

#define FEDLORA_VERSION "0.1.0"
