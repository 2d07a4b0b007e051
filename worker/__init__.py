from worker.app import app

__all__ = ["app"]
