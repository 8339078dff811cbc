#ifndef AGW_UPSTREAM_H
#define AGW_UPSTREAM_H
#endif
