/* ExPhil.Native version. This file is the single source of the version number:
 * the top-level CMakeLists.txt reads it to set the project version. */
#ifndef EXPHIL_VERSION_H
#define EXPHIL_VERSION_H

#define EXPHIL_VERSION_MAJOR 0
#define EXPHIL_VERSION_MINOR 2
#define EXPHIL_VERSION_PATCH 0
#define EXPHIL_VERSION_STRING "0.2.0"

#endif /* EXPHIL_VERSION_H */
