"""What the controller knows of its fleet beyond one tick: the instance table with its transition
table and one writer, the capacity cache and interruption history, the checkpoint ledger and the
GPU utilisation tracker."""
