from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("generation", "0004_ranking")]

    operations = [
        migrations.AddField(
            model_name="candidate",
            name="retry_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
