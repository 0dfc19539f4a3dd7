/* crc32c.h — CRC-32C (Castagnoli, the iSCSI/ext4/NVMe polynomial 0x1EDC6F41,
 * reflected), the checksum of every chunk of a checkpoint (checkpoint.h).
 *
 * fso_crc32c(0, buf, n) is the CRC of buf; a running CRC continues with the
 * previous result: fso_crc32c(fso_crc32c(0, a, na), b, nb) equals the CRC of
 * a followed by b. x86-64 CPUs with SSE4.2 use the crc32 instruction; others
 * a table, with the same results ("123456789" gives 0xE3069283). */
#ifndef FSO_CRC32C_H
#define FSO_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t fso_crc32c(uint32_t crc, const void *buf, size_t n);
/* The table version alone: the reference the instruction path is tested
 * against. */
uint32_t fso_crc32c_sw(uint32_t crc, const void *buf, size_t n);

#endif
