"""Operations on a store: compaction, pack/unpack."""
