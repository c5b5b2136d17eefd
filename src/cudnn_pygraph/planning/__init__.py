"""Planning: the manifest, engine ids, facts, ranking into ONE plan list, replay."""
