"""The fault-tolerance tests: replica groups under trainer.strategy=ft (torchft) with a real Lighthouse."""
